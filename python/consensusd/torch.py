"""A PyTorch optimizer that trains with a consensusd node.

Wrap the optimizer you already use; the training loop stays as it is:

    import consensusd.torch
    opt = consensusd.torch.Optimizer(torch.optim.Adam(model.parameters(), 1e-3), model,
                                     socket="/run/consensusd/n0.trainer.sock")
    for inputs, labels in loader:
        opt.zero_grad()
        loss = criterion(model(inputs), labels)
        loss.backward()
        if not opt.step(loss=loss.item()):
            break                 # the node finished training: opt.finished says why

Each step() is one round of the node: the forward and backward ran at the
node's x_k (loaded into the model's parameters before), the wrapped
optimizer steps from there, and the difference goes to the daemon as a
`delta` update (x_{k+1} = mix + delta, docs/trainers.md), with the gradient
it stepped from (the dynamic wait policy's statistics). Then the model
holds x_{k+1}, the next round's parameters.

With local_steps=H, a round is H steps of the wrapped optimizer from x_k
(H calls of step(), the loop unchanged) and one delta, x_after - x_k, for
the daemon: H times fewer exchanges for the same samples, as DiLoCo's
inner steps (docs/trainers.md, "Local steps and an outer step"). The gradient handed with it
is the first step's, at x_k; the loss, the mean of the H steps'.

When the node finishes training (train.rounds, consensusctl stop, ...),
step() returns False and the model holds the node's final parameters; a
step() after that raises consensusd.TrainingFinished. An update the daemon
rejects raises consensusd.UpdateRejected from step(), with the model back
at x_k: the next step()s compute the round again.

The model's parameters at construction are the node's x_0 on a fresh start:
seed the model's initialisation alike on every node. On a resumed node the
daemon's checkpointed x replaces them. The wrapped optimizer's state (Adam's
moments) is this process's to save: `opt.state_dict()`.
"""

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import consensusd

__all__ = ["Adam", "Optimizer"]


class Adam(torch.optim.Optimizer):
    """Adam for one of `nodes` nodes that average their estimates: steps as
    Adam on the nodes' mean gradient would, not as Adam on this node's own.

    Averaging the nodes' steps averages Adam's first moment exactly, but each
    node's second moment v is the square of its own gradient, whose noise is
    `nodes` times the mean gradient's: the mean step comes out up to
    sqrt(nodes) times smaller than Adam on the mean gradient takes, most on
    the noisiest coordinates. This Adam subtracts the surplus noise: with
    d_t = (g_t - g_{t-1})^2 / 2, an estimate of one gradient's noise (plus
    the small change of the gradient itself between consecutive steps), v is
    the average of g^2 less (1 - 1/nodes) times the average of d, and no
    lower than 1/nodes of the average of g^2 (a mean of independent
    gradients). It sends nothing more than Adam and computes little more
    (two more vectors a parameter: the last gradient and the average of d);
    the loop is unchanged. consensusd.torch.Optimizer calls moved() when the
    node skipped rounds, so that a gradient from before is no sample of the
    noise.
    docs/trainers.md, "Adam on a node", has the measurements.

    nodes=1 is torch.optim.Adam. Arguments as torch.optim.Adam's (without
    amsgrad); weight_decay is L2 added to the gradient, as there."""

    def __init__(self, params, lr=1e-3, nodes=1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if int(nodes) != nodes or nodes < 1:
            raise ValueError(f"nodes must be a whole number >= 1, not {nodes!r}")
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError("Adam: lr, eps, weight_decay >= 0 and betas in [0, 1)")
        super().__init__(params, dict(lr=lr, nodes=int(nodes), betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))

    def moved(self):
        """The parameters moved by more than a step and a round's mixing since
        the last step (rounds went by without one): the next gradient starts
        the noise's differences afresh."""
        for state in self.state.values():
            state.pop("previous_grad", None)

    def mean_square(self, p):
        """The estimate of the nodes' mean gradient's second moment for
        parameter p (bias-corrected), the square of what a step divides by."""
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        return self._mean_square(self.state[p], group)

    @staticmethod
    def _mean_square(state, group):
        beta2 = group["betas"][1]
        mean_sq = state["exp_avg_sq"] / (1 - beta2 ** state["step"])
        if state["noise_steps"] and group["nodes"] > 1:
            noise = state["noise_avg"] / (1 - beta2 ** state["noise_steps"])
            surplus = 1.0 - 1.0 / group["nodes"]  # the noise Adam on the mean would not see
            mean_sq = torch.maximum(mean_sq - surplus * noise, mean_sq / group["nodes"])
        return mean_sq

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("consensusd.torch.Adam does not take sparse gradients")
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if "step" not in state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)  # of this node's gradient
                    state["noise_steps"] = 0
                    state["noise_avg"] = torch.zeros_like(p)  # of d
                state["step"] += 1
                t = state["step"]
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                previous = state.get("previous_grad")
                if previous is not None:
                    state["noise_steps"] += 1
                    difference = (grad - previous).pow_(2).mul_(0.5)
                    state["noise_avg"].mul_(beta2).add_(difference, alpha=1 - beta2)
                    previous.copy_(grad)
                else:
                    state["previous_grad"] = grad.clone()
                denominator = self._mean_square(state, group).sqrt_().add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denominator, value=-group["lr"] / (1 - beta1 ** t))
        return loss


class Optimizer:
    """Wraps `optimizer` (over `model`'s parameters) to train as node `socket`.
    reconnect=True rides out daemon restarts (the model then continues from the
    daemon's checkpointed x); else a lost daemon raises consensusd.DaemonLost.
    local_steps: optimizer steps per round (one delta to the daemon after them).
    When the node's round jumps (rounds went by without this trainer), an
    optimizer with moved() (consensusd.torch.Adam) is told.
    mix_rounds: rounds after each delta that only mix (a zero delta, sent by
    step() itself): the node's next steps start from its neighbours' average
    after their steps rather than from that average plus its own last delta
    (docs/trainers.md, "Local steps and an outer step"); a delta then takes
    1 + mix_rounds of the node's rounds (train.rounds). With them,
    outer_lr and outer_momentum take DiLoCo's outer Nesterov step on what
    the mix moved since the local steps began (1.0 and 0: none)."""

    def __init__(self, optimizer, model, socket, timeout=30.0, reconnect=False, local_steps=1,
                 mix_rounds=0, outer_lr=1.0, outer_momentum=0.0):
        if int(local_steps) != local_steps or local_steps < 1:
            raise ValueError(f"local_steps must be a whole number >= 1, not {local_steps!r}")
        if int(mix_rounds) != mix_rounds or mix_rounds < 0:
            raise ValueError(f"mix_rounds must be a whole number >= 0, not {mix_rounds!r}")
        if not (outer_lr > 0 and 0 <= outer_momentum < 1):
            raise ValueError("outer_lr must be > 0 and outer_momentum in [0, 1)")
        outer = (outer_lr, outer_momentum) != (1.0, 0.0)
        if outer and mix_rounds < 1:
            raise ValueError("an outer step (outer_lr, outer_momentum) needs mix_rounds >= 1")
        self.optimizer = optimizer
        self.local_steps = int(local_steps)
        self.mix_rounds = int(mix_rounds)
        self._outer = (float(outer_lr), float(outer_momentum)) if outer else None
        self._slow = None  # the outer step's parameters: where the next local steps start
        self._velocity = None
        self._losses = []  # of this round's steps so far
        self._samples = 0  # of this round's steps so far, as given
        self._gradient = None  # the round's first gradient, at x_k
        self._test = (None, None)  # the latest accuracy and test loss given this round
        self._params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            x0 = parameters_to_vector(self._params).detach().cpu().numpy().astype(np.float32)
        self._node = consensusd.attach(socket, x0.size, "float32", init=x0, timeout=timeout,
                                       reconnect=reconnect)
        self._rounds = self._node.rounds()
        self._round = None
        self._next_round()
        self._first = self._x  # where the first local steps begin

    @property
    def round(self):
        """The node's round the model's parameters are at (None once finished)."""
        return None if self._round is None else self._round.index

    @property
    def finished(self):
        """Why the node stopped training (rounds, accuracy, time, stop, signal); None
        while it trains."""
        return self._node.finished

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, loss, accuracy=None, test_loss=None, samples=None):
        """Steps the wrapped optimizer; after local_steps of them (one by default),
        hands the delta from x_k to the node and loads x_{k+1} into the model.
        `accuracy` and `test_loss`: the model's test figures, when measured;
        `samples`: the batch's size, summed over the local steps for the
        node's bytes per sample (without it the daemon counts train.batch_size
        per round). Returns True while the node trains on (the model holds the next
        round's parameters, or this round's after a local step), False once it has
        finished (the model holds its final parameters)."""
        if self._round is None:
            raise consensusd.TrainingFinished(self.finished)
        if not self._losses:  # the gradient at x_k: the dynamic wait policy's statistics
            with torch.no_grad():
                gradient = parameters_to_vector(
                    [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params])
                self._gradient = gradient.detach().cpu().numpy()
        self.optimizer.step()
        self._losses.append(float(loss))
        if samples is not None:
            self._samples += int(samples)
        if accuracy is not None or test_loss is not None:
            self._test = (accuracy, test_loss)
        if len(self._losses) < self.local_steps:
            return True
        with torch.no_grad():
            after = parameters_to_vector(self._params).detach().cpu().numpy()
        delta = after.astype(np.float32) - self._x
        accuracy, test_loss = self._test
        losses, samples = self._losses, self._samples
        self._losses = []
        self._samples = 0
        self._test = (None, None)
        try:
            self._round.submit(delta, loss=float(np.mean(losses)), kind="delta",
                               accuracy=accuracy, test_loss=test_loss, gradient=self._gradient,
                               samples=samples or None)
        except consensusd.UpdateRejected:
            self._load(self._x)  # the round again, from x_k
            raise
        if not self._next_round():
            return False
        # Rounds that only mix (a zero delta): every node's next steps start
        # from the mix of its neighbours' parameters after their steps, not
        # from that mix plus its own last delta.
        for _ in range(self.mix_rounds):
            self._round.submit(np.zeros_like(self._x), loss=float(np.mean(losses)), kind="delta",
                               samples=0)
            if not self._next_round():
                return False
        if self._outer is not None:
            self._outer_step()
        return True

    def _outer_step(self):
        """DiLoCo's outer Nesterov step on the mix's motion since the last
        local steps began (the neighbours' average pseudo-gradient); the next
        local steps start from its result, and their delta is taken from the
        daemon's x_k as ever."""
        lr, momentum = self._outer
        if self._slow is None:  # the first local steps began at the node's x_0
            self._slow = self._first.copy()
            self._velocity = np.zeros_like(self._slow)
        pseudo = self._x - self._slow
        self._velocity = momentum * self._velocity + pseudo
        self._slow = self._slow + lr * (pseudo + momentum * self._velocity)
        self._load(self._slow)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)

    def close(self):
        self._node.close()

    def _next_round(self):
        """Loads the next round's x_k into the model; at the end, the node's final
        parameters (and False)."""
        last = self.round
        try:
            self._round = next(self._rounds)
        except StopIteration:
            self._round = None
            final = self._node.params
            if final is not None:
                self._load(np.asarray(final, dtype=np.float32))
            return False
        self._x = np.array(self._round.params, dtype=np.float32)  # x_k, ours to keep
        self._load(self._x)
        if last is not None and self._round.index != last + 1 and hasattr(self.optimizer, "moved"):
            self.optimizer.moved()  # rounds went by without us: consensusd.torch.Adam
        return True

    def _load(self, x):
        # A copy: the parameters take the tensor's storage, and the optimizer
        # steps them in place; self._x must stay x_k.
        device = self._params[0].device
        with torch.no_grad():
            vector_to_parameters(torch.tensor(x, device=device), self._params)
