"""A faster Triton CPU interpreter for the lab's kernels: each language patch done once per grid.

Triton's interpreter (3.9) re-patches triton.language (inspect.getmembers over tl, tl.tensor, tl.math and
tl.core) on every call of a nested @triton.jit helper, although the launch being interpreted has patched
those same module objects already and nothing undoes it until the grid ends. The lab's kernels call helpers
inside their K loops (decode, dot, epilogue pieces), so that scan was about half of the interpreter's time
on a MoE layer (cProfile: 300 of 667 s in _patch_builtin for one moe_h2g call). Here a helper's patch is
skipped when a patch of the same modules is already in force for the running grid; the launch's own patch,
and its restore when the grid ends, are Triton's. The interpreter's numpy dtype of a Triton type is also
looked up once per element type (Triton rebuilds a 19-entry dict on every cast and load: 23 us a call, about a
tenth of a moe_h2g call's time). Numerics are untouched (same interpreted operations). Applied only when
interpreting, and only where the interpreter has the names this relies on.
"""

import inspect


def install() -> bool:
    """Make nested-helper calls skip repeated language patches; True when installed (idempotent)."""
    try:
        from triton.runtime import interpreter as it
    except ImportError:
        return False
    if getattr(it, "_lab_once_per_grid", False):
        return True
    if not all(hasattr(it, n) for n in ("_patch_lang", "_LangPatchScope", "GridExecutor", "tl", "_get_np_dtype")):
        return False
    tl = it.tl
    np_dtype, pointer = it._get_np_dtype, it._get_np_dtype(tl.pointer_type(tl.int8))
    dtypes: dict = {}  # element type -> numpy dtype (block types are unhashable: looked up by their element)

    def np_dtype_once(tt):
        if isinstance(tt, tl.block_type):
            tt = tt.element_ty
        if isinstance(tt, tl.pointer_type):
            return pointer
        try:
            hit = dtypes.get(tt)
        except TypeError:  # an unhashable type: Triton's own lookup
            return np_dtype(tt)
        if hit is None:
            hit = dtypes[tt] = np_dtype(tt)
        return hit

    patch_lang, grid_call = it._patch_lang, it.GridExecutor.__call__
    patched: list[set] = []  # per running grid: the language modules patched in it
    keys: dict[int, tuple] = {}  # id(fn.__globals__) -> (those globals, kept alive; the language modules seen)

    def key(fn):
        g = fn.__globals__
        hit = keys.get(id(g))
        if hit is None:
            mods = frozenset(id(v) for v in g.values() if inspect.ismodule(v) and (v is tl or v is tl.core))
            hit = keys[id(g)] = (g, mods)
        return hit[1]

    def once_per_grid(fn):
        k = key(fn)
        if patched and k in patched[-1]:
            return it._LangPatchScope()  # nothing to restore: the grid's own scope restores the modules
        scope = patch_lang(fn)
        if patched:  # outside a grid nothing is remembered: every call patches, as Triton's own does
            patched[-1].add(k)
        return scope

    def call_grid(self, *args, **kwargs):
        patched.append(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    it._patch_lang = once_per_grid
    it._get_np_dtype = np_dtype_once
    it.GridExecutor.__call__ = call_grid
    it._lab_once_per_grid = True
    it._lab_np_dtype = np_dtype  # Triton's own, for the test that compares the two
    return True
