/* ctor_main.c: links libsnippet_ctor.so, whose constructor launched kernels before main ran. */
#include <stdio.h>
int snippet_ctor_launched(void);
int main(void) {
    printf("expect kernels=%d graphs=0 copies=0 other=0 captured=0\n", snippet_ctor_launched());
    return snippet_ctor_launched() == 3 ? 0 : 1;
}
