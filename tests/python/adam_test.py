"""consensusd.torch.Adam: torch's Adam at nodes=1, Adam on the mean gradient
of `nodes` nodes' noisy gradients otherwise, and its state saved whole."""

import unittest

import torch

import consensusd.torch


def run(optimizer_of, gradients, start):
    """The parameter after feeding `gradients` (one tensor per step) to the
    optimizer that optimizer_of([parameter]) makes, and that optimizer."""
    parameter = torch.nn.Parameter(start.clone())
    optimizer = optimizer_of([parameter])
    for gradient in gradients:
        parameter.grad = gradient.clone()
        optimizer.step()
    return parameter.detach(), optimizer


def denominator(state):
    """sqrt(v_hat) of torch's Adam, as its step divides by it."""
    return (state["exp_avg_sq"] / (1 - 0.999 ** state["step"])).sqrt()


class AdamTest(unittest.TestCase):
    def test_one_node_is_torch_adam(self):
        torch.manual_seed(1)
        model = torch.nn.Linear(5, 3)
        copy = torch.nn.Linear(5, 3)
        copy.load_state_dict(model.state_dict())
        reference = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.1)
        ours = consensusd.torch.Adam(copy.parameters(), lr=1e-2, nodes=1, weight_decay=0.1)
        for _ in range(50):
            inputs = torch.randn(8, 5)
            for net, optimizer in ((model, reference), (copy, ours)):
                optimizer.zero_grad()
                net(inputs).pow(2).sum().backward()
                optimizer.step()
        for a, b in zip(model.parameters(), copy.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    def test_without_noise_it_is_adam(self):
        gradient = torch.linspace(-1.0, 1.0, 11)
        start = torch.zeros(11)
        plain, _ = run(lambda p: torch.optim.Adam(p, lr=1e-3), [gradient] * 200, start)
        ours, _ = run(lambda p: consensusd.torch.Adam(p, lr=1e-3, nodes=8), [gradient] * 200, start)
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-7)

    def test_its_second_moment_is_the_mean_gradients(self):
        # 8 nodes, 1,000 coordinates: signal 0 to 1, noise 1 (noise-dominated
        # to signal-dominated). The nodes average their steps, so all hold
        # the same x: node 0's optimizer, fed its own gradients, against Adam
        # fed the mean of the 8.
        nodes, size = 8, 1000
        generator = torch.Generator().manual_seed(7)
        signal = torch.linspace(0.0, 1.0, size)
        parameters = [torch.nn.Parameter(torch.zeros(size)) for _ in range(3)]
        mean_adam = torch.optim.Adam([parameters[0]], lr=0.0)
        plain = torch.optim.Adam([parameters[1]], lr=0.0)
        ours = consensusd.torch.Adam([parameters[2]], lr=0.0, nodes=nodes)
        for _ in range(3000):
            draws = signal + torch.randn(nodes, size, generator=generator)
            for parameter, gradient in zip(parameters, (draws.mean(0), draws[0], draws[0])):
                parameter.grad = gradient
            for optimizer in (mean_adam, plain, ours):
                optimizer.step()

        wanted = denominator(mean_adam.state[parameters[0]])
        noisy, clean = slice(0, size // 10), slice(-size // 10, None)
        own = denominator(plain.state[parameters[1]]) / wanted  # up to sqrt(8) = 2.8x too much
        self.assertGreater(float(own[noisy].median()), 2.4)
        self.assertGreater(float(own[clean].median()), 1.1)
        corrected = ours.mean_square(parameters[2]).sqrt() / wanted
        self.assertAlmostEqual(float(corrected[noisy].median()), 1.0, delta=0.15)
        self.assertAlmostEqual(float(corrected[clean].median()), 1.0, delta=0.1)

    def test_after_moved_the_gradient_before_is_no_noise(self):
        # A steady gradient, then the parameters move and another steady one:
        # told so, the jump is not taken for noise and every step is Adam's.
        start = torch.zeros(5)
        before, after = torch.full((5,), 0.1), torch.full((5,), -2.0)
        plain, _ = run(lambda p: torch.optim.Adam(p, lr=1e-2), [before] * 10 + [after] * 10, start)
        for told in (True, False):
            parameter = torch.nn.Parameter(start.clone())
            ours = consensusd.torch.Adam([parameter], lr=1e-2, nodes=8)
            for k, gradient in enumerate([before] * 10 + [after] * 10):
                if told and k == 10:
                    ours.moved()
                parameter.grad = gradient.clone()
                ours.step()
            if told:
                torch.testing.assert_close(parameter.detach(), plain, rtol=1e-5, atol=1e-7)
            else:  # the jump counted as noise: larger steps since
                self.assertGreater(float((parameter.detach() - plain).abs().min()), 1e-3)

    def test_its_state_saves_and_loads_whole(self):
        generator = torch.Generator().manual_seed(3)
        gradients = [torch.randn(6, generator=generator) for _ in range(40)]
        start = torch.zeros(6)
        make = lambda p: consensusd.torch.Adam(p, lr=1e-2, nodes=4)  # noqa: E731
        whole, _ = run(make, gradients, start)
        half, first = run(make, gradients[:20], start)
        parameter = torch.nn.Parameter(half.clone())
        resumed = make([parameter])
        resumed.load_state_dict(first.state_dict())
        for gradient in gradients[20:]:
            parameter.grad = gradient.clone()
            resumed.step()
        torch.testing.assert_close(parameter.detach(), whole, rtol=0, atol=0)

    def test_nodes_must_be_a_whole_number(self):
        for nodes in (0, 1.5, -2):
            with self.assertRaises(ValueError):
                consensusd.torch.Adam([torch.nn.Parameter(torch.zeros(1))], nodes=nodes)


if __name__ == "__main__":
    unittest.main()
