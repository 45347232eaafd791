import os

if "libkrex" in os.environ.get("LD_PRELOAD", ""):   # the command, not the `krex run` wrapper itself
    print("site-chained")
