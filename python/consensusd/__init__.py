"""Attach a trainer process to its consensusd node (model.kind: external).

The daemon runs the node (neighbours, wait policy, mixing, checkpoints);
this process computes the updates. Parameters are shared through a memory
region the daemon creates and passes over the trainer socket, so each
round costs two short JSON lines, not a copy of the model:

    import consensusd
    with consensusd.attach("/run/consensusd/n0.trainer.sock", dimension, "float32",
                           init=x0) as node:
        for round in node.rounds():
            x = round.params                  # numpy view of x_k (read only)
            g, loss = compute_gradient(x)
            round.submit(g, loss=loss)        # or kind="delta": x_after - x_k
        print(node.finished)                  # why the node stopped: "rounds", ...
        final = node.params                   # the node's final parameters

Pure Python: numpy only (torch is optional, see consensusd.torch).
"""

import array
import json
import math
import mmap
import os
import socket
import time

import numpy as np

__all__ = ["attach", "Node", "Round", "DaemonError", "DaemonLost", "UpdateRejected",
           "TrainingFinished"]

_DTYPES = {"float32": np.float32, "float64": np.float64}


class DaemonError(RuntimeError):
    """The daemon refused the trainer (its message says why)."""


class DaemonLost(DaemonError):
    """The connection to the daemon was lost (it stopped, crashed or restarted)."""


class UpdateRejected(RuntimeError):
    """The update was rejected (NaN/Inf, wrong round or kind; by the daemon, or here for a
    figure JSON cannot carry); nothing was applied. The round stays open: submit again."""


class TrainingFinished(Exception):
    """The node has finished training (`reason`: rounds, accuracy, time, stop or signal):
    raised when a trainer asks for more after the end (see Node.finished)."""

    def __init__(self, reason):
        super().__init__("the node finished training (%s)" % reason)
        self.reason = reason


class Round:
    """One round: the parameters x_k to compute at, and where to put the update."""

    def __init__(self, node, index):
        self._node = node
        self.index = index

    @property
    def params(self):
        """x_k, a read-only numpy view of the shared region (valid until submit)."""
        return self._node._params

    @property
    def update(self):
        """The update slot, a writable numpy view: compute into it and submit(None, ...)
        to hand it back without a copy."""
        return self._node._update

    def submit(self, update, loss, kind="gradient", accuracy=None, test_loss=None,
               gradient=None, grad_variance=None, samples=None):
        """Hand back the update at x_k: a gradient (the daemon's optimizer steps) or a
        delta x_after - x_k (the trainer's own optimizer stepped); None: what the
        update slot holds. With a delta, `gradient` (the gradient at x_k the step
        came from) gives the dynamic wait policy its statistics. `accuracy` (in
        [0, 1]) and `test_loss`, when given, are shown as the node's test figures;
        `grad_variance`: the trace of the per-sample gradients' covariance;
        `samples`: the training samples behind the update (the daemon counts
        train.batch_size without it), for bytes per sample.

        Returns once the daemon took the update. Raises UpdateRejected if it did
        not (or, before sending, if `loss`, `accuracy`, `test_loss` or
        `grad_variance` is not finite): the round stays open, submit again."""
        self._node._submit(self.index, update, loss, kind, accuracy, test_loss, gradient,
                           grad_variance, samples)


class Node:
    """A trainer's connection to its daemon; use attach() to make one."""

    def __init__(self, path, dimension, dtype="float32", init=None, timeout=30.0,
                 reconnect=False):
        if dtype not in _DTYPES:
            raise ValueError("dtype must be float32 or float64, not %r" % dtype)
        self.dimension = int(dimension)
        self.dtype = dtype
        self.finished = None  # why the node stopped training, once it has
        self._path = path
        self._init = init
        self._timeout = timeout
        self._reconnect = reconnect
        self._sock = None
        self._region = None
        self._params = self._update = self._gradient = None
        self._next = None  # the daemon's next round or end, read ahead by submit()
        self._open = None  # the round given and not yet taken
        self._reattach(first=True)

    @property
    def params(self):
        """The parameters the daemon last put in the shared region: x_k during a round,
        the node's final parameters once it finished (a copy; None without a region)."""
        return None if self._params is None else np.array(self._params)

    def _attach(self):
        self._sock = _connect(self._path, self._timeout)
        self._buffer = b""
        try:
            self._send({"type": "hello", "dimension": self.dimension, "dtype": self.dtype})
        except DaemonLost as lost:
            # A daemon that refuses us says why, then closes: read its reason.
            self._receive()
            raise lost
        welcome, fds = self._receive(with_fds=True)
        if welcome.get("type") != "welcome" or not fds:
            raise DaemonError("unexpected answer to hello: %r" % welcome)
        self._region = mmap.mmap(fds[0], welcome["region_bytes"])
        _close_fds(fds)
        item = _DTYPES[self.dtype]
        # x_k, the update, and the gradient a delta came from.
        slots = np.frombuffer(self._region, dtype=item).reshape(-1, self.dimension)
        self._update = slots[1]
        self._gradient = slots[2]
        if welcome.get("fresh"):
            # A fresh start takes x_0 from the trainer: every trainer should
            # initialise alike (the same seed), or the nodes start apart.
            if self._init is None:
                raise DaemonError("the daemon starts fresh and needs initial parameters: "
                                  "pass init= (the same on every node)")
            slots[0][:] = np.asarray(self._init, dtype=item).reshape(-1)
            self._send({"type": "init"})
        self._params = slots[0].view()
        self._params.flags.writeable = False

    def rounds(self):
        """Yields each round the daemon gives this trainer, and ends when the node
        finishes training (`finished` then says why, `params` holds the node's final
        parameters). When the daemon goes away without saying so, or stops on a
        signal (it may be restarting): with reconnect=True, attaches again (retrying
        up to `timeout` seconds) and goes on at the round the daemon resumed, else
        raises DaemonLost; a daemon that stopped on a signal and does not come back
        within `timeout` ends the loop. Each round must be submitted (and taken)
        before the next is asked for."""
        while True:
            if self._open is not None:
                raise RuntimeError("round %d was not taken: submit an update for it first "
                                   "(the daemon waits for one)" % self._open)
            if self.finished is not None:
                return
            event = self._next or self._await()
            self._next = None
            if event["type"] == "rejected":  # our initial parameters (NaN/Inf)
                raise UpdateRejected(event.get("reason", "rejected"))
            if event["type"] == "end":
                self.finished = event.get("reason", "stop")
                return
            self._open = event["round"]
            yield Round(self, event["round"])

    def _await(self):
        """The daemon's next round, end or rejection, attaching again if it went away."""
        while True:
            try:
                message = self._receive()
            except DaemonLost:
                if not self._reconnect:
                    raise
                self._reattach()
                continue
            kind = message.get("type")
            if kind == "end" and message.get("reason") == "signal" and self._reconnect:
                # Stopped by a signal: maybe for a restart. Back within the
                # timeout, it goes on; else this is the end it said.
                final = self.params
                try:
                    self._reattach()
                except DaemonLost:
                    self._params = final
                    return message
                continue
            if kind in ("round", "end", "rejected"):
                return message

    def _reattach(self, first=False):
        """Attaches (again, after the daemon went away). A connection can be lost
        while it is made (a dying daemon's socket still takes it, then resets it):
        try again until `timeout`; a refusal (DaemonError) ends it. A daemon not
        back by then is lost (DaemonLost); at first, not reachable (DaemonError)."""
        deadline = time.monotonic() + self._timeout
        self._open = None  # a round given by a daemon that went away is gone with it
        while True:
            self._detach()
            try:
                self._attach()
                return
            except DaemonLost:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            except _Unreachable as e:
                if first:
                    raise DaemonError(str(e)) from None
                raise DaemonLost(str(e)) from None

    def _submit(self, index, update, loss, kind, accuracy, test_loss, gradient=None,
                grad_variance=None, samples=None):
        if self._open != index:
            raise UpdateRejected("round %d is not the round given (%s)" % (
                index, "none is open" if self._open is None else self._open))
        figures = {"loss": loss, "accuracy": accuracy, "test_loss": test_loss,
                   "grad_variance": grad_variance}
        for name, value in figures.items():
            if value is not None and not math.isfinite(float(value)):
                raise UpdateRejected("`%s` is not finite (%r): JSON cannot carry it" %
                                     (name, value))
        if update is not None:
            self._update[:] = self._flat(update, "update")
        message = {"type": "update", "round": int(index), "kind": kind, "loss": float(loss)}
        if gradient is not None:
            self._gradient[:] = self._flat(gradient, "gradient")
            message["gradient"] = True
        if grad_variance is not None:
            message["grad_variance"] = float(grad_variance)
        if accuracy is not None:
            message["accuracy"] = float(accuracy)
        if test_loss is not None:
            message["test_loss"] = float(test_loss)
        if samples is not None:
            message["samples"] = int(samples)
        try:
            self._send(message)
        except DaemonLost:
            pass  # gone: what it said before (its end?) is still to be read, below
        # The daemon answers a rejection at once; else its next round (or end)
        # comes when this round is over: read ahead for rounds(). A daemon gone
        # meanwhile: see rounds().
        event = self._await()
        if event["type"] == "rejected":
            raise UpdateRejected(event.get("reason", "rejected"))
        self._open = None
        self._next = event

    def _flat(self, values, name):
        """`values` as one flat vector of the node's dimension."""
        values = np.asarray(values).reshape(-1)
        if values.size != self.dimension:
            raise ValueError("%s has %d values, the node trains %d" %
                             (name, values.size, self.dimension))
        return values

    def _detach(self, keep_params=False):
        if keep_params and self._params is not None:
            self._params = np.array(self._params)  # the final parameters outlive the region
        elif not keep_params:
            self._params = None
        self._update = self._gradient = None
        if self._region is not None:
            try:
                self._region.close()
            except BufferError:  # a caller still holds a view: the mapping goes with it
                pass
            self._region = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self):
        self._detach(keep_params=self.finished is not None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, message):
        try:
            self._sock.sendall((json.dumps(message) + "\n").encode())
        except OSError as e:
            raise DaemonLost("lost the daemon: %s" % e) from e

    def _receive(self, with_fds=False):
        fds = []
        while b"\n" not in self._buffer:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(4096, socket.CMSG_SPACE(4))
            except OSError as e:
                raise DaemonLost("lost the daemon: %s" % e) from e
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
            if not data:
                raise DaemonLost("the daemon closed the connection")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if message.get("type") == "error":
            _close_fds(fds)
            raise DaemonError(message.get("message", "error"))
        return (message, fds) if with_fds else message


def _connect(path, timeout):
    """Connects, retrying with back-off while the daemon (re)starts."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError as e:
            sock.close()
            if time.monotonic() + delay > deadline:
                raise _Unreachable("cannot reach the daemon at %s: %s" % (path, e)) from e
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class _Unreachable(Exception):
    """No daemon listens at the socket (yet, or any more)."""


def _close_fds(fds):
    for fd in fds:
        os.close(fd)


def attach(path, dimension, dtype="float32", init=None, timeout=30.0, reconnect=False):
    """Attaches to the daemon's trainer socket (retrying up to `timeout` seconds).
    reconnect=True: rounds() rides out daemon restarts (see Node.rounds)."""
    return Node(path, dimension, dtype, init, timeout, reconnect)
