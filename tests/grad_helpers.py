"""Gradient-test helpers: parameters as explicit inputs, and implementation-versus-reference gradients."""
import torch


class _Call(torch.nn.Module):
    def __init__(self, module, fn):
        super().__init__()
        self.module, self.fn = module, fn

    def forward(self, *args):
        return self.fn(*args)


def call_with_params(module, params: dict, fn, *args):
    """fn(*args) while module's parameters named in `params` are the given tensors (torch.func.functional_call
    swaps them in and restores the module's own afterwards), so gradcheck and autograd.grad can treat
    parameters as inputs."""
    return torch.func.functional_call(_Call(module, fn), {f"module.{n}": t for n, t in params.items()}, args, strict=False)


def assert_same_gradients(impl, reference, inputs, atol=1e-10):
    """impl(*inputs) equals reference(*inputs), and so do the gradients of <output, w> for a random w
    with respect to every input (q, k, v, parameters)."""
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    got, want = impl(*inputs), reference(*inputs)
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    w = torch.randn_like(want)
    got_grads = torch.autograd.grad((got * w).sum(), inputs)
    want_grads = torch.autograd.grad((want * w).sum(), inputs)
    for i, (g, r) in enumerate(zip(got_grads, want_grads)):
        assert r.abs().max() > 0, f"input {i} gets no gradient from the reference: the comparison would be empty"
        assert torch.allclose(g, r, atol=atol), f"input {i}: max |diff| {(g - r).abs().max().item():.3g}"
