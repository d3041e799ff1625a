"""What every side of the language-model comparison shares: the inner
optimizer and its schedule, the validation measurement and the line it
prints, and the emulated stragglers.

Every side trains the same model from the same x_0 (seeded), on the same
shares of the text, batches of --batch windows of the model's block, AdamW
(weight decay 0.1, betas 0.9/0.95) with a linear warm-up and a cosine decay
to a tenth of the peak at the last step, gradients clipped to norm 1.
"""

import math
import time

import numpy as np
import torch

import corpus
import model as lm

WEIGHT_DECAY, BETAS, CLIP = 0.1, (0.9, 0.95), 1.0


def add_arguments(parser, steps=1600, lr=3e-3):
    """The arguments every side takes."""
    parser.add_argument("--size", default="small", choices=sorted(lm.SIZES),
                        help="the model (examples/lm/model.py SIZES)")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps per process")
    parser.add_argument("--batch", type=int, default=16, help="windows of the block a step")
    parser.add_argument("--lr", type=float, default=lr, help="AdamW's peak learning rate")
    parser.add_argument("--warmup", type=int, default=100, help="steps of linear warm-up")
    parser.add_argument("--seed", type=int, default=1, help="x_0 (alike on every process)")
    parser.add_argument("--eval-every", type=int, default=100,
                        help="steps between validation measurements (0: only the last)")
    parser.add_argument("--eval-windows", type=int, default=256,
                        help="validation windows measured between")
    parser.add_argument("--final-windows", type=int, default=0,
                        help="validation windows measured at the end (0: all of them)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")


def setup(args):
    """The seeded model (x_0) and torch's threads."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    return lm.build(args.size)


def adamw(parameters, args):
    return torch.optim.AdamW(parameters, lr=args.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


def schedule(optimizer, step, args):
    """Sets the learning rate of `step` (0-based): warm-up, then cosine to lr/10."""
    if step < args.warmup:
        rate = args.lr * (step + 1) / args.warmup
    else:
        progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        rate = args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
    for group in optimizer.param_groups:
        group["lr"] = rate


def clip(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)


class Validation:
    """Mean cross-entropy (nats per byte) on the held-out text, in windows of
    the model's block that tile it: every k-th window (`windows` of them, the
    same on every side) between, `final` of them (0: all, 196 kB) when `whole`."""

    def __init__(self, block, windows, final=0):
        text = corpus.validation()
        count = (len(text) - 1) // block
        tiles = np.arange(count) * block

        def spread(n):
            return tiles if n <= 0 or n >= count else tiles[::count // n][:n]
        self._all = self._tensors(text, spread(final), block)
        self._some = self._tensors(text, spread(windows), block)

    @staticmethod
    def _tensors(text, starts, block):
        windows = torch.from_numpy(np.stack([text[s:s + block + 1] for s in starts]).astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    @torch.no_grad()
    def loss(self, model, whole=False):
        inputs, targets = self._all if whole else self._some
        total = 0.0
        for start in range(0, len(inputs), 64):
            total += float(model.loss(inputs[start:start + 64], targets[start:start + 64])) * \
                len(inputs[start:start + 64])
        return total / len(inputs)


def report(step, loss, validation, reached):
    """The line the comparisons read; `reached`: seconds since the first step,
    when the parameters were reached (not the measurement's end)."""
    print(f"step {step}  loss {loss:.4f}  val loss {validation:.4f}  "
          f"bpb {validation / math.log(2):.3f}  {reached:.1f} s", flush=True)


def started():
    """Prints the wall-clock time of the first step (the comparisons line several
    processes up by it) and returns the monotonic start."""
    print(f"first step at {time.time():.3f} (unix time)", flush=True)
    return time.monotonic()


def blas_in_use():
    """The BLAS library this process has mapped (after a matrix product)."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    with open("/proc/self/maps") as maps:
        names = {line.split()[-1] for line in maps if "blas" in line.split()[-1]}
    return ", ".join(sorted(names)) or "none mapped"


def check_blas():
    """Warns when torch runs on the reference BLAS (libblas3): about 20x slower
    for the transformer's matrix products than OpenBLAS (libopenblas0-pthread)."""
    mapped = blas_in_use()
    if "openblas" not in mapped:
        print(f"warning: torch's BLAS is {mapped}, not OpenBLAS: steps will be about 20x "
              "slower (apt-get install libopenblas0-pthread; scripts/bootstrap does)", flush=True)


class Straggler:
    """The daemon's straggler models, a step at a time, in the process (the
    baselines' ranks and compare-lm's trainers alike: the same draws for the
    same rank and node): --bimodal P:FACTOR:BASE_MS sleeps
    (FACTOR - 1) x BASE_MS with probability P a step, --delay-ms D every step,
    --pareto SCALE_MS:SHAPE a Pareto draw every step."""

    def __init__(self, args, rank):
        self._rng = np.random.default_rng(7919 + rank)
        self._bimodal = [float(x) for x in args.bimodal.split(":")] if args.bimodal else None
        self._pareto = [float(x) for x in args.pareto.split(":")] if args.pareto else None
        self._delay_ms = args.delay_ms

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--bimodal", help="P:FACTOR:BASE_MS, as straggler.kind: bimodal")
        parser.add_argument("--pareto", help="SCALE_MS:SHAPE, as straggler.kind: pareto")
        parser.add_argument("--delay-ms", type=float, default=0.0,
                            help="as straggler.kind: constant")

    def sleep(self):
        extra = self._delay_ms
        if self._bimodal and self._rng.random() < self._bimodal[0]:
            extra += (self._bimodal[1] - 1) * self._bimodal[2]
        if self._pareto:  # inverse CDF, u in (0, 1]: scale / u^(1/shape)
            extra += self._pareto[0] * (1.0 - self._rng.random()) ** (-1.0 / self._pareto[1])
        if extra > 0:
            time.sleep(extra / 1000)
