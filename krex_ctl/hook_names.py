"""The names KREX_HOOKS and `krex run --hooks` accept: krex_hooks.REGISTRY's (Python hooks) and the shim's own
(nvtx). A module of its own, importing nothing: every hooked command's interpreter reads it at its start
(krex_hooks checks at import that its registry is this list; krex_ctl never imports the hooks)."""

PYTHON_HOOKS = ("cupyx", "inductor", "kernelbench", "torch_timer", "triton")
SHIM_HOOKS = ("nvtx",)
HOOK_NAMES = PYTHON_HOOKS + SHIM_HOOKS
