"""Label-free refinement of a fitted key: match the checkpoint's own logits on the anchors through
the frozen late layers, by Adam (:func:`refine_key`) or a few damped Gauss–Newton steps
(:func:`gauss_newton_key`).

.. math:: \\min_T \\frac1N \\sum_i \\big\\| z_A(x_i) - \\mathrm{late}_A(T(\\mathrm{early}_{AB}(x_i))) \\big\\|^2
"""

from __future__ import annotations

from functools import partial

import torch

from avalanche_plugins.core.calls import eval_mode, iterate_batches, model_forward
from avalanche_plugins.core.checks import (
    check_choice,
    check_int,
    check_model_inputs,
    check_positive,
)
from avalanche_plugins.transport.keys import TransportKey
from avalanche_plugins.transport.stitch import StitchedModel, stage_activations

__all__ = ["gauss_newton_key", "optimize_key", "refine_key"]


def _logit_targets(stitched: StitchedModel, anchors: torch.Tensor, task_labels):
    """The label-free refinement targets: the checkpoint's own logits on the anchors, and the
    updated model's stage activations the key maps (both in eval mode, no graph)."""
    with torch.no_grad(), eval_mode(stitched.late_model), eval_mode(stitched.early_model):
        return (model_forward(stitched.late_model, anchors, task_labels),
                stage_activations(stitched.early_model, stitched.stage, anchors, task_labels,
                                  getattr(stitched, "select", None)))



def refine_key(key: TransportKey, stitched: StitchedModel, anchors: torch.Tensor, task_labels=None, *,
               steps: int = 50, lr: float = 1e-2) -> TransportKey:
    """Refine ``key`` in place without labels: Adam on ``‖z_stitched(x) − z_late(x)‖²`` over the
    anchors, where ``z_late`` are the checkpoint's (``stitched.late_model``'s) own logits.

    The closed form matches activations at the stage; this matches what the frozen late layers
    make of them, so errors the head is sensitive to weigh more. The models are not modified
    (only ``torch.autograd.grad`` w.r.t. the key is taken; no ``.grad`` is written).

    Reproducibility: deterministic for a fixed number of torch threads. Adam's normalised steps
    amplify the float rounding of multi-threaded reductions, so the refined key differs across
    thread counts (measured: 1.3e-3 relative between 1 and 2 threads); pin
    ``torch.set_num_threads`` when comparing runs (the benchmarks run with one thread per worker).
    """
    check_model_inputs(stitched, anchors, "anchors")
    check_int("steps", steps, minimum=0)
    check_positive("lr", lr)
    if key.family == "identity" or steps == 0:
        return key
    target, u = _logit_targets(stitched, anchors, task_labels)
    with eval_mode(stitched.late_model):
        return optimize_key(
            key, lambda: ((stitched.forward_from_stage(key(u), anchors, task_labels) - target) ** 2).mean(),
            steps=steps, lr=lr)



def gauss_newton_key(key: TransportKey, stitched: StitchedModel, anchors: torch.Tensor, task_labels=None, *,
                     iterations: int = 2, damping: float = 0.1, max_tries: int = 6,
                     chunk_size: int = 256, solver: str = "auto", cg_tol: float = 1e-3,
                     cg_max_iter: int = 500) -> TransportKey:
    """Refine ``key`` in place without labels by Levenberg–Marquardt on the objective of
    :func:`refine_key`, ``Σ_i ‖z_late(x_i) − z_stitched(x_i)‖²`` over the anchors.

    Each iteration linearises the stitched logits in the key's parameters θ,
    ``z(θ + δ) ≈ z(θ) + J δ`` with ``J`` the ``(N·K) × P`` Jacobian (K logits, P key numbers),
    and takes the damped Gauss–Newton step

        ``δ = (JᵀJ + λI)⁻¹ Jᵀ r = Jᵀ (JJᵀ + λI)⁻¹ r``,   ``r = z_late − z(θ)``,

    solving whichever Gram matrix is smaller in float64, with ``λ = damping · tr(G)/dim(G)``
    (``G`` that Gram matrix). A step that does not lower the objective is retried with 10× the
    damping (up to ``max_tries``); an accepted one divides it by 3. Cost per iteration: one
    forward and ``K`` vectorised backward passes of the late layers on the anchors (``vmap``
    of one ``vjp``), plus the per-(anchor, logit) key gradients (closed form, the key being
    linear in its parameters): about ``K + 1`` Adam steps of :func:`refine_key`, for what takes
    it tens of steps; and the Gram matrix, ``min(N·K, P)² · max(N·K, P)`` multiply-adds (a
    cross-channel key at a 256-channel stage, 100 anchors × 100 classes: 6.6·10¹² per iteration,
    minutes on one CPU thread).

    Solvers: ``"direct"`` forms the Gram matrix and solves it (Cholesky-class cost above);
    ``"cg"`` never forms it: Jacobi-preconditioned conjugate gradients on the same damped system
    in the same (smaller) space, stopped at relative residual ``cg_tol`` or ``cg_max_iter``
    iterations (an inexact LM step, which the acceptance test below still checks), with
    matrix-free products ``J v`` (the key applied with parameters ``v``, dotted
    with the kept logit gradients) and ``Jᵀ w`` (one ``vjp`` of the key): ``2·(N·K·|h| + cost of the
    key on the anchors)`` per iteration. ``"auto"`` (default) takes ``"cg"`` when the Gram matrix
    would cost over 10¹¹ multiply-adds (e.g. 100 anchors × 100 classes at a 256-channel stage),
    else ``"direct"``. The LM acceptance test applies to either.

    Memory: the rows of ``J`` are computed ``chunk_size`` at a time (anchors in chunks of
    ``chunk_size``, logits in chunks of ``chunk_size // anchors``; fewer rows when 128 MB of
    float64 rows would not hold them, i.e. for keys of over 65,536 numbers). In the primal form
    (``P ≤ N·K``) ``JᵀJ`` and ``Jᵀr`` are accumulated chunk by chunk and ``J`` is never held; in
    the dual form (``N·K < P``) each row is kept as the smaller of its ``J`` row and its logit
    gradient at the stage (float32), from which the row is recomputed; ``"cg"`` keeps them so in
    both forms. Peak: the Gram matrix (``"direct"``), ``8·min(N·K, P)²`` bytes, the kept rows,
    plus two blocks of 128 MB of rows; the result does not depend on ``chunk_size`` (up to
    float64 rounding).

    Example:
        >>> torch.manual_seed(0) is not None
        True
        >>> from torch import nn
        >>> from avalanche_plugins.transport import fit_transport_key, stitch
        >>> a = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        >>> b = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        >>> x = torch.randn(32, 4)
        >>> key = fit_transport_key(stage_activations(b, "1", x), stage_activations(a, "1", x), "cross_channel")
        >>> stitched = stitch(b, a, "1", key)
        >>> before = ((stitched(x) - a(x)) ** 2).sum().item()
        >>> _ = gauss_newton_key(key, stitched, x)
        >>> ((stitched(x) - a(x)) ** 2).sum().item() < before
        True
    """
    check_model_inputs(stitched, anchors, "anchors")
    check_int("iterations", iterations, minimum=0)
    check_positive("damping", damping)
    check_int("max_tries", max_tries)
    check_int("chunk_size", chunk_size)
    check_choice("solver", solver, GN_SOLVERS)
    check_positive("cg_tol", cg_tol)
    check_int("cg_max_iter", cg_max_iter)
    if key.family == "identity" or iterations == 0:
        return key
    problem = _Linearisation(key, stitched, anchors, task_labels, chunk_size)
    if solver == "auto":
        solver = "cg" if problem.gram_multiply_adds() > _DIRECT_MULTIPLY_ADDS else "direct"
    if solver == "cg":
        problem.u64 = problem.u.double()

        def damped_system(params):
            return _cg_system(problem, params, tol=cg_tol, max_iter=cg_max_iter)
    else:
        damped_system = partial(_dual_system if problem.dual else _primal_system, problem)

    with eval_mode(stitched.late_model):
        params = _levenberg_marquardt(problem.params, problem.objective, damped_system, problem.sizes,
                                      iterations=iterations, damping=damping, max_tries=max_tries)
    with torch.no_grad():
        for p, value in zip(key.parameters(), params):
            p.copy_(value)
    return key


class _Linearisation:
    """The least-squares problem of :func:`gauss_newton_key`: residuals ``r = z_late − z(θ)`` over
    the anchors, the rows of their Jacobian ``J`` in the key's parameters θ, and the key's
    matrix-free products ``∂h/∂θ · v`` and ``∇_θ ⟨cotangent, h(θ)⟩`` (the key is linear in θ)."""

    def __init__(self, key: TransportKey, stitched: StitchedModel, anchors: torch.Tensor, task_labels,
                 chunk_size: int):
        self.key, self.stitched, self.anchors, self.task_labels = key, stitched, anchors, task_labels
        self.chunk_size = chunk_size
        self.target, self.u = _logit_targets(stitched, anchors, task_labels)
        self.names = [name for name, _ in key.named_parameters()]
        self.n = anchors.shape[0]
        self.params = tuple(p.detach() for p in key.parameters())
        self.sizes = [p.numel() for p in self.params]
        self.n_params = sum(self.sizes)
        self.n_rows = self.n * self.target.shape[-1]
        self.dual = self.n_rows < self.n_params  # solve the smaller Gram matrix
        self.rows_per_pass = max(1, min(chunk_size, _ROW_BYTES // (8 * self.n_params)))  # long rows: fewer per pass
        self.u64 = None  # the anchors' stage activations in float64, for the matrix-free products (CG)

    def gram_multiply_adds(self) -> int:
        """Cost of forming the smaller Gram matrix, ``min(N·K, P)² · max(N·K, P)``."""
        return min(self.n_rows, self.n_params) ** 2 * max(self.n_rows, self.n_params)

    def key_at(self, params, inputs):
        return torch.func.functional_call(self.key, dict(zip(self.names, params)), (inputs,))

    def late(self, h, a: slice):
        return self.stitched.forward_from_stage(h, self.anchors[a], _labels_of(self.task_labels, a, self.n))

    def objective(self, params) -> float:
        """``Σ ‖z_late − z(θ)‖²`` over the anchors, chunk by chunk."""
        with torch.no_grad():
            return sum(float(((self.target[a] - self.late(self.key_at(params, self.u[a]), a)) ** 2).sum())
                       for a in iterate_batches(self.n, self.chunk_size))

    def jacobian_rows(self, a: slice, dz_dh) -> torch.Tensor:
        """The (anchors · logits) × P rows of ``J``, anchor-major, float64."""
        return torch.cat(_linear_key_rows(self.key, self.names, self.u[a], dz_dh), 2).flatten(0, 1).double()

    def logit_gradients(self, params):
        """``(anchors, dz/dh (logits, anchors, *h), residual (anchors · logits))`` chunk by chunk."""
        for a in iterate_batches(self.n, self.rows_per_pass):
            z, pullback = torch.func.vjp(lambda h, a=a: self.late(h, a), self.key_at(params, self.u[a]))
            n_logits = z.shape[-1]
            eye = torch.eye(n_logits, dtype=z.dtype, device=z.device)
            for c in iterate_batches(n_logits, max(1, self.rows_per_pass // (a.stop - a.start))):
                cotangents = eye[c][:, None, :].expand(c.stop - c.start, *z.shape)
                (dz_dh,) = torch.func.vmap(pullback)(cotangents)        # (|c|, anchors, *h.shape[1:])
                yield a, dz_dh.detach(), (self.target[a] - z.detach())[:, c].flatten().double()

    def key_times(self, v: torch.Tensor) -> torch.Tensor:
        """The key's map with parameters ``v`` (flat) on every anchor: ``∂h/∂θ · v``, (N, *h)."""
        return self.key_at(tuple(part.view(p.shape) for part, p in zip(v.split(self.sizes), self.params)), self.u64)

    def key_transpose_times(self, cotangent: torch.Tensor) -> torch.Tensor:
        """``∇_θ ⟨cotangent, key_θ(u)⟩``, flat (the key is linear in θ)."""
        zero = tuple(torch.zeros_like(p, dtype=torch.float64) for p in self.params)
        grads = torch.func.vjp(lambda q: self.key_at(q, self.u64), zero)[1](cotangent)[0]
        return torch.cat([g.flatten() for g in grads])

    def kept_rows(self, params, *, products: bool = False) -> _KeptRows:
        """This iteration's :class:`_KeptRows` (with the key's matrix-free products for CG)."""
        return _KeptRows(self.logit_gradients(params), self.jacobian_rows, self.n_params,
                         key_times=self.key_times if products else None,
                         key_transpose_times=self.key_transpose_times if products else None)


def _direct_solver(gram: torch.Tensor, rhs: torch.Tensor, back=None):
    """``(diag G, solve)``: ``solve(λ)`` solves ``(G + λI) x = rhs`` (``G`` modified in place: no
    second Gram-sized matrix) and returns ``back(x)`` (``x`` when None)."""
    diagonal = gram.diagonal().clone()

    def solve(lam):
        gram.diagonal().copy_(diagonal + lam)
        solution = torch.linalg.solve(gram, rhs)
        return solution if back is None else back(solution)

    return diagonal, solve


def _primal_system(problem: _Linearisation, params):
    """``P ≤ N·K``: ``(JᵀJ + λI) δ = Jᵀr``, with ``JᵀJ`` and ``Jᵀr`` accumulated chunk by chunk
    (``J`` never held)."""
    device = problem.target.device
    gram = torch.zeros(problem.n_params, problem.n_params, dtype=torch.float64, device=device)
    rhs = torch.zeros(problem.n_params, dtype=torch.float64, device=device)
    for a, dz_dh, r in problem.logit_gradients(params):
        jac = problem.jacobian_rows(a, dz_dh)
        gram += jac.T @ jac
        rhs += jac.T @ r
    return _direct_solver(gram, rhs)


def _dual_system(problem: _Linearisation, params):
    """``N·K < P``: ``(JJᵀ + λI) α = r``, ``δ = Jᵀα``, from the kept rows."""
    rows = problem.kept_rows(params)
    return _direct_solver(rows.gram(problem.n_params), rows.residual(), rows.transpose_times)


def _cg_system(problem: _Linearisation, params, *, tol: float, max_iter: int):
    """The damped system in the smaller space by conjugate gradients, never forming the Gram matrix."""
    rows = problem.kept_rows(params, products=True)
    return rows.cg_system(dual=problem.dual, tol=tol, max_iter=max_iter)


def _levenberg_marquardt(params: tuple, objective, damped_system, sizes: list[int], *, iterations: int,
                         damping: float, max_tries: int) -> tuple:
    """Levenberg–Marquardt: ``iterations`` damped Gauss–Newton steps from ``params``.

    ``damped_system(params) -> (diag G, solve)``, ``solve(λ)`` the step for damping ``λ``. The
    damping is ``λ = scale · mean(diag G)``; a step that does not lower ``objective`` is retried
    with 10× the scale (up to ``max_tries``), an accepted one divides it by 3. Stops early when
    ``G`` is zero (nothing depends on the parameters) or no damping lowers the objective.
    """
    lam_scale = damping
    loss = objective(params)
    for _ in range(iterations):
        diagonal, solve = damped_system(params)
        base = float(diagonal.mean())
        if base == 0:
            break  # the logits do not depend on the key here: nothing to fit
        for _ in range(max_tries):
            step = solve(lam_scale * base)
            trial = tuple(p + d.view_as(p).to(p.dtype) for p, d in zip(params, step.split(sizes)))
            trial_loss = objective(trial)
            if trial_loss < loss:
                params, loss, lam_scale = trial, trial_loss, lam_scale / 3
                break
            lam_scale *= 10
        else:
            break  # no damping lowered the objective: keep the current key
    return params


_ROW_BYTES = 1 << 27  # float64 rows of J held at once (per pass, per Gram block): 128 MB
_DIRECT_MULTIPLY_ADDS = 1e11  # "auto": above this a Gram matrix costs more than CG (seconds on one thread)
GN_SOLVERS = ("auto", "direct", "cg")


class _KeptRows:
    """The dual form's Jacobian, chunk by chunk: each chunk keeps the smaller of its rows of ``J``
    (float32) and its logit gradients at the stage (recomputed into rows when needed)."""

    block_bytes = _ROW_BYTES  # float64 rows per Gram block: recomputed rows are made in fewer, larger blocks

    def __init__(self, gradients, jacobian_rows, n_params: int, *, key_times=None, key_transpose_times=None):
        """Keep the chunks of ``gradients`` (``(anchors, dz/dh, residual)``, as
        :meth:`_Linearisation.logit_gradients` yields them); a chunk keeps its rows when they are
        shorter than its logit gradients (``n_params ≤ |h|``). With the key's matrix-free products
        (``∂h/∂θ · v``, ``∇_θ ⟨cotangent, h(θ)⟩``; the CG solver) the logit gradients are merged
        into one tensor where possible (:meth:`merge_logit_gradients`)."""
        self.chunks, self.residuals, self.offsets = [], [], [0]
        self.merged = None  # (anchors, logits, |h|): every chunk's logit gradients in one tensor
        self.key_times, self.key_transpose_times = key_times, key_transpose_times
        for a, dz_dh, r in gradients:
            self.add(a, dz_dh, r, jacobian_rows, keep_rows=n_params <= dz_dh[0, 0].numel())
        if key_times is not None:
            self.merge_logit_gradients()

    def merge_logit_gradients(self) -> None:
        """When every chunk keeps the logit gradients of all logits for consecutive anchors, move
        them into one (anchors, logits, |h|) tensor (chunk by chunk: one chunk's copy at a time),
        so that ``J v`` and ``Jᵀ α`` are one batched product each instead of one per chunk."""
        if not self.chunks or any(c[2] for c in self.chunks):
            return
        n_logits = {c[1].shape[1] for c in self.chunks}
        starts = [c[0].start for c in self.chunks]
        stops = [c[0].stop for c in self.chunks]
        if len(n_logits) != 1 or starts != [0] + stops[:-1]:
            return  # logits split across chunks (very large keys): products stay per chunk
        first = self.chunks[0][1]
        merged = torch.empty((stops[-1], *first.shape[1:]), dtype=first.dtype, device=first.device)
        for i, (anchors, value, is_rows, jacobian_rows, shape) in enumerate(self.chunks):
            merged[anchors] = value
            self.chunks[i] = (anchors, merged[anchors], is_rows, jacobian_rows, shape)
        self.merged = merged

    def add(self, anchors: slice, dz_dh, residual, jacobian_rows, *, keep_rows: bool) -> None:
        # logit gradients are kept anchor-major, (anchors, logits, |h|), for batched products
        value = jacobian_rows(anchors, dz_dh).float() if keep_rows else dz_dh.flatten(2).transpose(0, 1).contiguous()
        self.chunks.append((anchors, value, keep_rows, jacobian_rows, dz_dh.shape))
        self.residuals.append(residual)
        self.offsets.append(self.offsets[-1] + residual.numel())

    def rows(self, i: int) -> torch.Tensor:
        anchors, value, is_rows, jacobian_rows, shape = self.chunks[i]
        return value.double() if is_rows else jacobian_rows(anchors, value.transpose(0, 1).view(shape))

    def gram_diagonal(self, *, dual: bool) -> torch.Tensor:
        """``diag(JJᵀ)`` (squared row norms, ``dual``) or ``diag(JᵀJ)`` (squared column norms),
        from the rows made chunk by chunk."""
        if dual:
            return torch.cat([self.rows(i).pow(2).sum(1) for i in range(len(self.chunks))])
        return sum(self.rows(i).pow(2).sum(0) for i in range(len(self.chunks)))

    def cg_system(self, *, dual: bool, tol: float, max_iter: int):
        """``(diag G, solve)``; ``solve(λ)``: the step ``δ`` of the damped system by
        :func:`_conjugate_gradient` with the Jacobi preconditioner, in the dual (``(JJᵀ + λI) α = r``,
        ``δ = Jᵀα``) or primal (``(JᵀJ + λI) δ = Jᵀr``) space, never forming the Gram matrix."""
        res = self.residual()
        diagonal = self.gram_diagonal(dual=dual)
        rhs = res if dual else self.transpose_times(res)

        def solve(lam):
            def precondition(r):
                return r / (diagonal + lam)

            if dual:
                alpha = _conjugate_gradient(lambda v: self.times(self.transpose_times(v)) + lam * v, rhs,
                                            precondition, tol=tol, max_iter=max_iter)
                return self.transpose_times(alpha)
            return _conjugate_gradient(lambda v: self.transpose_times(self.times(v)) + lam * v, rhs,
                                       precondition, tol=tol, max_iter=max_iter)

        return diagonal, solve

    def times(self, v: torch.Tensor) -> torch.Tensor:
        """``J v``: kept rows times ``v``; elsewhere the kept logit gradients dotted with the key's
        change ``∂h/∂θ · v`` (one pass of the key over every anchor)."""
        change = None if all(c[2] for c in self.chunks) else self.key_times(v)
        if self.merged is not None:
            dh = change.reshape(self.merged.shape[0], -1, 1).to(self.merged.dtype)
            return torch.bmm(self.merged, dh).double().flatten()
        out = []
        for anchors, value, is_rows, _, _ in self.chunks:
            if is_rows:
                out.append(value.double() @ v)
            else:  # (anchors, logits, |h|) @ (anchors, |h|, 1), in the kept gradients' precision
                dh = change[anchors].reshape(value.shape[0], -1, 1).to(value.dtype)
                out.append(torch.bmm(value, dh).double().flatten())
        return torch.cat(out)

    def residual(self) -> torch.Tensor:
        return torch.cat(self.residuals)

    def _blocks(self, n_params: int) -> list[list[int]]:
        """Consecutive chunks grouped into blocks of about ``block_bytes`` float64 rows."""
        limit = max(1, self.block_bytes // (8 * n_params))
        blocks, rows = [[]], 0
        for i in range(len(self.chunks)):
            size = self.offsets[i + 1] - self.offsets[i]
            if blocks[-1] and rows + size > limit:
                blocks.append([])
                rows = 0
            blocks[-1].append(i)
            rows += size
        return blocks

    def _block_rows(self, chunks: list[int]) -> torch.Tensor:
        return self.rows(chunks[0]) if len(chunks) == 1 else torch.cat([self.rows(c) for c in chunks])

    def gram(self, n_params: int) -> torch.Tensor:
        """``JJᵀ`` in float64, block by block."""
        o = self.offsets
        gram = torch.empty(o[-1], o[-1], dtype=torch.float64, device=self.residuals[0].device)
        blocks = self._blocks(n_params)
        for i, left_chunks in enumerate(blocks):
            left = self._block_rows(left_chunks)
            li = slice(o[left_chunks[0]], o[left_chunks[-1] + 1])
            for right_chunks in blocks[:i + 1]:
                right = left if right_chunks is left_chunks else self._block_rows(right_chunks)
                ri = slice(o[right_chunks[0]], o[right_chunks[-1] + 1])
                block = left @ right.T
                gram[li, ri] = block
                gram[ri, li] = block.T
        return gram

    def transpose_times(self, alpha: torch.Tensor) -> torch.Tensor:
        """``Jᵀ α``: kept rows transposed times ``α``; elsewhere (with the key's products set) the
        logit gradients weighted by ``α`` summed into one cotangent at the stage, pulled back
        through the key once; else rows made chunk by chunk."""
        if self.merged is not None and self.key_transpose_times is not None:
            n, n_logits = self.merged.shape[:2]
            weights = alpha.view(n, 1, n_logits).to(self.merged.dtype)
            cotangent = torch.bmm(weights, self.merged).view(n, *self.chunks[0][4][2:]).double()
            return self.key_transpose_times(cotangent)
        o = self.offsets
        total, cotangent = 0, None
        for i, (anchors, value, is_rows, _, shape) in enumerate(self.chunks):
            part = alpha[o[i]:o[i + 1]]
            if is_rows:
                total = total + value.double().T @ part
            elif self.key_transpose_times is not None:
                weights = part.view(value.shape[0], 1, value.shape[1]).to(value.dtype)
                piece = torch.bmm(weights, value).view(value.shape[0], *shape[2:]).double()
                if cotangent is None:
                    cotangent = torch.zeros((self._n_anchors(), *shape[2:]), dtype=torch.float64,
                                            device=piece.device)
                cotangent[anchors] += piece
            else:
                total = total + self.rows(i).T @ part
        return total if cotangent is None else total + self.key_transpose_times(cotangent)

    def _n_anchors(self) -> int:
        return max(anchors.stop for anchors, *_ in self.chunks)


def _conjugate_gradient(matvec, rhs: torch.Tensor, precondition, *, tol: float, max_iter: int) -> torch.Tensor:
    """Solve ``A x = rhs`` for symmetric positive definite ``A`` (given by ``matvec``) by
    preconditioned conjugate gradients (``precondition(r)`` ≈ ``A⁻¹ r``); stops at
    ``‖A x − rhs‖ ≤ tol · ‖rhs‖`` or after ``max_iter`` iterations."""
    x = torch.zeros_like(rhs)
    scale = float(rhs.norm())
    if scale == 0:
        return x
    residual = rhs.clone()
    z = precondition(residual)
    direction = z.clone()
    rz = residual @ z
    for _ in range(max_iter):
        a_dir = matvec(direction)
        step = rz / (direction @ a_dir)
        x += step * direction
        residual -= step * a_dir
        if float(residual.norm()) <= tol * scale:
            break
        z = precondition(residual)
        rz, previous = residual @ z, rz
        direction = z + (rz / previous) * direction
    return x


def _linear_key_rows(key: TransportKey, names: list[str], u: torch.Tensor, dz_dh: torch.Tensor) -> list[torch.Tensor]:
    """Rows of ``J`` in closed form: a key's output is linear in its parameters, so a row is
    ``∇_θ ⟨g, key_θ(u)⟩`` with ``g = ∂z/∂h``, whatever θ. Per parameter in ``names`` order,
    ``(anchors, logits, numel)``; with positions ``s`` (conv map pixels, tokens):
    ``∂/∂W_oi = Σ_s g_os u_is``, ``∂/∂s_c = Σ_s g_cs u_cs``, ``∂/∂b_o = Σ_s g_os`` (batched
    matrix products: one autograd pass per row was 5× slower)."""

    def by_channel(t, lead):  # (*lead, C, S): channel first, positions flattened last
        if key.layout == "channels_first":
            return t.flatten(len(lead) + 1)
        return t.reshape(*lead, -1, t.shape[-1]).transpose(-1, -2)

    n_logits, n_anchors = dz_dh.shape[:2]
    g = by_channel(dz_dh, (n_logits, n_anchors))                       # (K, N, C_out, S)
    x = by_channel(u, (n_anchors,)).to(g.dtype)                        # (N, C_in, S)
    rows = {"bias": g.sum(-1).transpose(0, 1)}                         # (N, K, C_out)
    if key.family == "channel":
        rows["scale"] = torch.einsum("knos,nos->nko", g, x)
    else:
        rows["weight"] = torch.einsum("knos,nis->nkoi", g, x).flatten(2)
    return [rows[name] for name in names]


def _labels_of(task_labels, rows: slice, n: int):
    """The task labels of the anchors ``rows`` (per-anchor labels are sliced, one label is kept)."""
    if isinstance(task_labels, torch.Tensor) and task_labels.dim() > 0 and task_labels.shape[0] == n:
        return task_labels[rows]
    return task_labels


def optimize_key(key: TransportKey, loss_of_key, *, steps: int, lr: float) -> TransportKey:
    """Adam on ``key``'s parameters only, in place: ``steps`` times ``loss_of_key()`` (a closure that
    calls the key). Gradients come from ``torch.autograd.grad`` w.r.t. the key, so the models the
    loss runs through never get ``.grad`` written; the key is left frozen again."""
    params = list(key.parameters())
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params, lr=lr)
    try:
        for _ in range(steps):
            for p, g in zip(params, torch.autograd.grad(loss_of_key(), params)):
                p.grad = g
            optimizer.step()
    finally:
        for p in params:
            p.grad = None
            p.requires_grad_(False)
    return key
