"""kernels.ring_sync.strip on PTX shaped as Triton 3.6 emits gemv_mma's TMA ring (sm_90)."""

from kernels.ring_sync import MARK, strip

PTX = """\
\tmov.b32 %r17, %r18; // {mark}
\t@%p39 mbarrier.init.shared::cta.b64 [%r18], 1;
\tfence.proxy.async.shared::cta;
\tbar.sync \t0;
\t@%p1 mbarrier.arrive.expect_tx.shared.b64 _, [%r18], 21504;
\tbar.sync \t0;
\t@%p2 cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%r20], [%rd6, {{%r1}}], [%r18];
$L__BB0_3:                              // =>This Inner Loop Header: Depth=1
\tbar.sync \t0;
\tmbarrier.try_wait.parity.shared.b64 complete, [%r35], %r36;
\tld.shared.v4.b32 {{%r1, %r2, %r3, %r4}}, [%r40];
\tbar.sync \t0;
\t@%p14 mbarrier.arrive.expect_tx.shared.b64 _, [%r37], 21504;
\tfence.proxy.async.shared::cta;
\tbar.sync \t0;
\telect.sync \t%r376|%p20, -1;
\t@%p15 cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%r38], [%rd6, {{%r39}}], [%r37];
\tbar.sync \t0;
\t@%p17 cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%r41], [%rd4, {{%r39}}], [%r37];
\tbar.sync \t0;
\twgmma.fence.sync.aligned;
\twgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {{%f1}}, {{%r1}}, %rd31, 1, 1, 1, 1;
\tld.shared.v4.b32 {{%r1, %r2, %r3, %r4}}, [%r41];
\tbar.sync \t0;
\tst.shared.b32 [%r42], %r1;
\t@%p26 bra \t$L__BB0_3;
\tbar.sync \t0;
\t@%p1 mbarrier.arrive.expect_tx.shared.b64 _, [%r18], 5632;
"""


def test_strip_drops_only_the_loops_redundant_barriers():
    """In the loop: the barrier before the expect, the fence after it, the barriers before each copy and the
    one between the last copy and the wgmma go; the loop's first barrier (the kernel's own, before its
    mbarrier wait) and a barrier guarding shared loads against stores stay, as does everything outside the
    loop (the mbarrier init's fence and barrier, the prologue's and the tail's copies)."""
    marked = PTX.format(mark=MARK)
    out = strip(marked).split("\n")
    head = next(i for i, x in enumerate(out) if "Loop Header" in x)
    back = next(i for i, x in enumerate(out) if "bra \t$L__BB0_3" in x)
    loop, outside = out[head:back + 1], out[:head] + out[back + 1:]
    bars = [i for i, x in enumerate(loop) if "bar.sync" in x]
    assert len(bars) == 2 and bars[0] == 1 and "st.shared" in loop[bars[1] + 1]
    assert not any("fence.proxy.async" in x for x in loop)
    assert sum("bar.sync" in x for x in outside) == 3 and sum("fence.proxy.async" in x for x in outside) == 1
    assert len(out) == len(marked.split("\n")) - 5


def test_strip_leaves_unmarked_ptx_alone():
    plain = PTX.format(mark="another comment")
    assert strip(plain) == plain
