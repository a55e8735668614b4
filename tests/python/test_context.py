"""`with torchdefer.deferred():`: the block form of deferred_init (Note [deferred() is
deferred_init without a callable] in bindings/torchdefer/_deferred_init.py)."""

import contextlib
import threading

import pytest
import torch
import torchdefer

from test_torchdefer import Gpt2Like, LlamaLike, assert_same_state, bitwise_equal


def eager_then_next_draw(make, seed=0):
    torch.manual_seed(seed)
    built = make()
    return built, torch.rand(4)


def test_modules_and_tensors_built_in_the_block_materialize_to_eager_bitwise():
    def build():
        return Gpt2Like(), LlamaLike(), torch.nn.Linear(8, 3), torch.randn(5, 2)

    (gpt, llama, head, noise), eager_next = eager_then_next_draw(build)
    torch.manual_seed(0)
    with torchdefer.deferred():
        d_gpt, d_llama, d_head, d_noise = build()
    assert bitwise_equal(torch.rand(4), eager_next), "the block left the generator elsewhere"
    for module in (d_gpt, d_llama, d_head):
        assert torchdefer.is_deferred(module)
    assert torchdefer.is_fake(d_noise)
    for module in (d_llama, d_head, d_gpt):  # any order: one recording holds them all
        torchdefer.materialize_module(module)
    torchdefer.materialize_tensor(d_noise)
    assert_same_state(gpt, d_gpt)
    assert_same_state(llama, d_llama)
    assert_same_state(head, d_head)
    assert bitwise_equal(noise, d_noise)
    assert d_gpt.lm_head.weight is d_gpt.wte.weight


def test_the_block_records_what_deferred_init_records():
    torch.manual_seed(3)
    by_call = torchdefer.deferred_init(torch.nn.TransformerEncoderLayer, 16, 2, 32)
    torch.manual_seed(3)
    with torchdefer.deferred():
        by_block = torch.nn.TransformerEncoderLayer(16, 2, 32)
    for (name, a), (_, b) in zip(by_call.named_parameters(), by_block.named_parameters()):
        assert torchdefer.explain(a) == torchdefer.explain(b), name


def test_counter_mode_gives_the_values_of_deferred_init():
    torch.manual_seed(1)
    by_call = torchdefer.deferred_init(LlamaLike)
    torch.manual_seed(1)
    with torchdefer.deferred():
        by_block = LlamaLike()
    torchdefer.materialize_module(by_call, rng="counter")
    torchdefer.materialize_module(by_block, rng="counter")
    assert_same_state(by_call, by_block)


def test_outside_the_block_torch_is_as_before():
    with torchdefer.deferred():
        pass
    assert not torchdefer.is_fake(torch.zeros(2))
    assert not torch.overrides._is_torch_function_mode_enabled()
    assert repr(torch.ones(1)) == "tensor([1.])"


def test_an_exception_closes_the_block_and_propagates():
    with pytest.raises(ZeroDivisionError):
        with torchdefer.deferred():
            half_built = torch.nn.Linear(4, 4)
            1 / 0
    assert torchdefer.is_fake(half_built.weight)
    assert not torchdefer.is_fake(torch.zeros(2))
    assert not torch.overrides._is_torch_function_mode_enabled()
    torch.manual_seed(0)
    eager = torch.nn.Linear(4, 4)
    torch.manual_seed(0)
    with torchdefer.deferred():
        deferred = torch.nn.Linear(4, 4)
    torchdefer.materialize_module(deferred)
    assert_same_state(eager, deferred)


def test_blocks_and_deferred_init_nest_each_recording_on_its_own():
    def build():
        outer = torch.nn.Linear(6, 6)
        inner = torch.nn.Linear(6, 2)
        called = torch.nn.Linear(2, 2)
        after = torch.nn.Linear(6, 4)
        return outer, inner, called, after

    eager, eager_next = eager_then_next_draw(build)
    torch.manual_seed(0)
    with torchdefer.deferred():
        outer = torch.nn.Linear(6, 6)
        with torchdefer.deferred():
            inner = torch.nn.Linear(6, 2)
            called = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
        assert torchdefer.is_fake(torch.zeros(1)), "the outer block is still recording"
        after = torch.nn.Linear(6, 4)
    assert bitwise_equal(torch.rand(4), eager_next)
    deferred = (outer, inner, called, after)
    for module in reversed(deferred):
        torchdefer.materialize_module(module)
    for e, d in zip(eager, deferred):
        assert_same_state(e, d)


def test_a_block_inside_deferred_init_records_separately():
    def build():
        with torchdefer.deferred():
            inner = torch.nn.Linear(3, 3)
        return torch.nn.Sequential(torch.nn.Linear(3, 3)), inner

    torch.manual_seed(0)
    eager_inner = torch.nn.Linear(3, 3)
    eager = (torch.nn.Sequential(torch.nn.Linear(3, 3)), eager_inner)
    torch.manual_seed(0)
    outer, inner = torchdefer.deferred_init(build)
    torchdefer.materialize_module(inner)
    torchdefer.materialize_module(outer)
    assert_same_state(eager[0], outer)
    assert_same_state(eager[1], inner)


def test_other_threads_build_real_tensors_while_a_block_is_open():
    seen = {}

    def other_thread():
        seen["fake"] = torchdefer.is_fake(torch.nn.Linear(2, 2).weight)
        seen["mode"] = torch.overrides._is_torch_function_mode_enabled()

    with torchdefer.deferred():
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert torchdefer.is_fake(torch.zeros(1))
    assert seen == {"fake": False, "mode": False}


def test_threads_each_with_their_own_block_record_their_own_models():
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def build(index):
        try:
            with torchdefer.deferred():
                barrier.wait()  # both blocks are open at once
                model = torch.nn.Linear(8, 8)
                with torch.no_grad():
                    model.weight.copy_(torch.arange(64.0).view(8, 8) * index)
            barrier.wait()
            torchdefer.materialize_module(model)
            results[index] = model.weight.clone()
        except Exception as error:  # reported by the main thread's assertion
            errors.append(error)

    workers = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors
    for index in range(2):
        assert bitwise_equal(results[index], torch.arange(64.0).view(8, 8) * index)


def test_exiting_on_another_thread_is_refused_and_leaves_the_block_open():
    block = torchdefer.deferred()
    block.__enter__()
    failures = []

    def exit_elsewhere():
        try:
            block.__exit__(None, None, None)
        except RuntimeError as error:
            failures.append(str(error))

    worker = threading.Thread(target=exit_elsewhere)
    worker.start()
    worker.join()
    assert torchdefer.is_fake(torch.zeros(1)), "the block must stay open on its thread"
    block.__exit__(None, None, None)
    assert not torchdefer.is_fake(torch.zeros(1))
    assert len(failures) == 1
    assert "on a thread other than the one that entered it" in failures[0]
    assert "test_context.py" in failures[0]


def test_exiting_an_outer_block_before_an_inner_one_is_refused():
    outer, inner = torchdefer.deferred(), torchdefer.deferred()
    with contextlib.ExitStack() as cleanup:
        outer.__enter__()
        cleanup.callback(outer.__exit__, None, None, None)
        inner.__enter__()
        cleanup.callback(inner.__exit__, None, None, None)
        with pytest.raises(RuntimeError, match="entered inside it, is still active; exit the inner block first"):
            outer.__exit__(None, None, None)
    assert not torchdefer.is_fake(torch.zeros(1))


def test_a_block_is_entered_once_at_a_time_and_can_be_entered_again():
    block = torchdefer.deferred()
    with block:
        with pytest.raises(RuntimeError, match="is already active; nest a new torchdefer.deferred()"):
            block.__enter__()
        first = torch.nn.Linear(2, 2)
    with block:
        second = torch.nn.Linear(2, 2)
    assert torchdefer.is_fake(first.weight) and torchdefer.is_fake(second.weight)
    with pytest.raises(RuntimeError, match="is not active, so it cannot be exited"):
        block.__exit__(None, None, None)


def test_errors_recorded_in_a_block_name_its_line():
    with pytest.raises(RuntimeError, match=r"in deferred_init of torchdefer\.deferred\(\) at test_context\.py:\d+"):
        with torchdefer.deferred():
            torch.nn.Linear(2, 2).weight.view(3)


def test_the_block_lists_the_top_level_modules_built_in_it():
    existing = torch.nn.Linear(2, 2)
    with torchdefer.deferred() as block:
        model = Gpt2Like()
        head = torch.nn.Linear(8, 3)
        called = torchdefer.deferred_init(torch.nn.Linear, 2, 2)  # deferred_init's own result
        with torchdefer.deferred() as inner:
            nested = torch.nn.Sequential(torch.nn.Linear(2, 2))
        torch.nn.Linear(2, 2)(existing.weight)  # built and dropped: not the block's result
        assert block.modules == []
    assert inner.modules == [nested]
    assert len(block.modules) == 2 and block.modules[0] is model and block.modules[1] is head
    assert torchdefer.is_deferred(called)  # deferred_init's result is its own, not the block's
    for module in block.modules:
        torchdefer.materialize_module(module)
    assert not torchdefer.is_deferred(model) and not torchdefer.is_deferred(head)


def test_modules_built_on_other_threads_are_not_the_blocks():
    built = []
    with torchdefer.deferred() as block:
        worker = threading.Thread(target=lambda: built.append(torch.nn.Linear(2, 2)))
        worker.start()
        worker.join()
    assert block.modules == []
    assert not torchdefer.is_fake(built[0].weight)


def test_the_registration_hooks_live_only_while_a_block_is_open():
    from torch.nn.modules import module

    hooks = (
        module._global_parameter_registration_hooks,
        module._global_buffer_registration_hooks,
        module._global_module_registration_hooks,
    )
    before = [len(h) for h in hooks]
    with torchdefer.deferred():
        assert [len(h) for h in hooks] == [n + 1 for n in before]
        with torchdefer.deferred():
            assert [len(h) for h in hooks] == [n + 1 for n in before]
    assert [len(h) for h in hooks] == before


class Configured(torch.nn.Module):
    """A module class that compares by value, and so is not hashable, as dataclass modules are."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)

    def __eq__(self, other):
        return isinstance(other, Configured)

    __hash__ = None


def test_the_block_lists_modules_that_are_not_hashable():
    with torchdefer.deferred() as block:
        model = Configured()
    assert len(block.modules) == 1 and block.modules[0] is model


def test_an_unhashable_module_is_guarded_and_materializes_like_any_other():
    torch.manual_seed(4)
    eager = Configured()
    torch.manual_seed(4)
    model = torchdefer.deferred_init(Configured)
    with pytest.raises(RuntimeError, match="still holds deferred tensors"):
        model.proj(torch.zeros(1, 2))
    torchdefer.materialize_module(model)
    assert torch.equal(model.proj.weight, eager.proj.weight)
    model.proj(torch.zeros(1, 2))
