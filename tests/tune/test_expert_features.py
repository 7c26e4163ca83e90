"""The expert features' machine: every fact it divides by is :class:`~tvm_fusion_ext.targets.TargetInfo`'s."""

from tvm_fusion_ext.targets import TargetInfo, resolve_target
from tvm_fusion_ext.tune.expert_features import Machine, machine_of


def test_cpu_machine_is_target_info():
    target = resolve_target("llvm")
    info = TargetInfo.of(target)
    want = Machine(cores=info.cores, lanes=info.lanes(), register_bytes=info.vector_register_bytes,
                   l1_bytes=info.l1_bytes, l2_bytes=info.l2_bytes)
    assert machine_of(target) == want


def test_cuda_machine_is_one_thread_block():
    target = resolve_target("cuda:sm_90")
    info = TargetInfo.of(target)
    machine = machine_of(target)
    assert machine.register_bytes == 4 * info.max_registers_per_thread == 4 * 255
    assert machine.l1_bytes == machine.l2_bytes == info.max_shared_memory_per_block
    assert (machine.cores, machine.lanes) == (1, 4)
