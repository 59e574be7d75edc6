"""util.function_call.call: a torch.autograd.Function applied as usual where a gradient may be needed, its
forward run directly otherwise, with the same result either way."""
import torch

from poskit.util.function_call import call


class Scaled(torch.autograd.Function):
    applied = 0  # forwards that ran under Function.apply

    @staticmethod
    def forward(ctx, x, factor: float):
        if not isinstance(ctx, torch.autograd.function.FunctionCtx):
            assert ctx.needs_input_grad == (False, False)
        else:
            Scaled.applied += 1
        ctx.save_for_backward(x)
        ctx.factor = factor
        return x * factor

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def test_no_backward_possible_runs_the_forward_alone_with_the_same_result():
    x = torch.randn(5)
    Scaled.applied = 0
    with torch.no_grad():
        a = call(Scaled, x.requires_grad_(), 3.0)  # grad mode off: no backward whatever x needs
    b = call(Scaled, x.detach(), 3.0)  # no argument needs a gradient
    assert Scaled.applied == 0
    assert a.grad_fn is None and b.grad_fn is None and not a.requires_grad
    torch.testing.assert_close(a, x.detach() * 3.0, rtol=0, atol=0)
    torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_the_forward_alone_records_no_graph_of_what_it_reads_besides_its_arguments():
    # as under Function.apply, the forward runs with grad mode off: a tensor it reads that is not an argument
    # (here a parameter requiring a gradient) leaves no graph on the output
    weight = torch.randn(5, requires_grad=True)

    class ReadsWeight(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * weight

        @staticmethod
        def backward(ctx, grad):
            return grad * weight

    out = call(ReadsWeight, torch.randn(5))
    applied = ReadsWeight.apply(torch.randn(5))
    assert not out.requires_grad and not applied.requires_grad


def test_an_argument_needing_a_gradient_gets_the_function_and_its_backward():
    x = torch.randn(5, requires_grad=True)
    Scaled.applied = 0
    out = call(Scaled, x, 3.0)
    assert Scaled.applied == 1 and out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((5,), 3.0))


def test_inside_forward_ad_the_function_is_applied_not_bypassed():
    # run alone, the forward would drop a tangent silently; applied, the Function refuses it (no jvp defined)
    import pytest
    import torch.autograd.forward_ad as fwAD

    Scaled.applied = 0
    with fwAD.dual_level():
        x = fwAD.make_dual(torch.randn(5), torch.ones(5))
        with pytest.raises(Exception):
            call(Scaled, x, 3.0)
    assert Scaled.applied == 1
