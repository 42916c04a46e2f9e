"""Stepping a block of envs into shared arrays: the same code in a worker and in the calling process.

A :class:`Stepper` holds the envs ``[start, stop)`` of one block and runs one protocol command
on all of them, reading actions from and writing results to views of the shared segment. A
worker process (:mod:`shmvec.worker`) serves its block with one; with ``step_in_main`` the
calling process steps the last block with another, so both behave identically.

Only the standard library is imported at module level: a spawned worker imports this module
before it sets the thread-count variables of BLAS/OpenMP, which must precede numpy.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shmvec.protocol import (
    ActionPayload,
    CallPayload,
    Command,
    ConstructError,
    EnvRecord,
    Mismatch,
    Reports,
    ResetPayload,
    RolloutPayload,
    SetAttrPayload,
    Spaces,
    WorkerOptions,
    error_report,
)

if TYPE_CHECKING:
    from shmvec.info_columns import InfoLayout
    from shmvec.layout import Layout, Regions

# Plain ints for the per-step paths: comparing with one costs less than with an enum member.
_STEP, _ROLLOUT_STEP = int(Command.STEP), int(Command.ROLLOUT_STEP)


def _obs_error(message: str) -> Exception:
    """An :class:`~shmvec.errors.EnvObsError` (imported here, on the error path: that module
    imports Gymnasium, which a spawned worker must not load before its thread settings).
    """
    from shmvec.errors import EnvObsError

    return EnvObsError(message)


class Targets:
    """Where one step of a block reads its actions and writes its results (views of its slice)."""

    __slots__ = ("obs", "final_obs", "act", "rewards", "terminations", "truncations", "raw", "act_address")

    def __init__(
        self, obs: list, final_obs: list, act: list, rewards: Any, terminations: Any, truncations: Any
    ) -> None:
        self.obs, self.final_obs, self.act = obs, final_obs, act
        self.rewards, self.terminations, self.truncations = rewards, terminations, truncations
        # Byte views of the three, for struct's pack_into: one C call writes a block's
        # per-env values, where numpy would first discover the list's dtype and shape.
        self.raw = tuple(memoryview(v).cast("B") for v in (rewards, terminations, truncations))
        # Where a staged int64 action batch goes (the compiled round copies it there; 0: the
        # actions are not one contiguous int64 array).
        first = act[0] if len(act) == 1 else None
        staged = first is not None and first.dtype == "int64" and first.flags.c_contiguous
        self.act_address: int = first.ctypes.data if first is not None and staged else 0


class Stepper:
    """The envs ``[start, start + len(envs))`` of a block, stepping into shared views."""

    def __init__(
        self,
        envs: list,
        start: int,
        layout: Layout,
        views: dict,
        options: WorkerOptions,
        observation_space: Any,
        action_space: Any,
        replies_pickled: bool = False,
    ) -> None:
        import numpy as np
        from gymnasium.vector import AutoresetMode

        from shmvec.info_columns import InfoRoute

        self.envs = envs
        self.start = start
        self.stop = start + len(envs)
        self.options = options
        mode = AutoresetMode(options.autoreset_mode)  # (a plain value in WorkerOptions)
        self.next_step = mode is AutoresetMode.NEXT_STEP
        self.same_step = mode is AutoresetMode.SAME_STEP
        # The protocol's table names the method that runs each command (step kinds run inline).
        self._handlers = {int(c): getattr(self, c.handler) for c in Command if c.handler != "step"}
        self.observation_space = observation_space
        self.action_space = action_space
        self.home = self._targets(layout, views, None)  # the regions step and reset use
        self.rows: list[Targets] = []  # one per row of the rollout segment, once attached
        self.infos = InfoRoute(start, replies_pickled)  # how the envs' infos travel
        self.obs_leaves = layout.obs_leaves
        leaf0 = self.obs_leaves[0]
        self.flat_obs = len(self.obs_leaves) == 1 and not leaf0.path and not leaf0.pickled
        # How each observation leaf is written, chosen once: a pickled one is one object per env.
        self._writers = [self._write_object if leaf.pickled else self._write_leaf for leaf in self.obs_leaves]
        # Small observations are gathered and written once per block: one numpy call instead
        # of a check and an item assignment per env (cheaper up to a few KB per env; past
        # that the extra copy costs more than the calls it saves).
        self.gather_obs = self.flat_obs and int(np.prod(leaf0.shape)) * leaf0.dtype.itemsize <= 4096
        self.flat_act = len(layout.act_leaves) == 1 and not layout.act_leaves[0].path
        self.act_scalar = [leaf.shape == () for leaf in layout.act_leaves]
        sl = slice(self.start, self.stop)
        # This block's slice of each pickled region, by name: what a worker receives with a
        # step's command (actions) and sends back with its reply (observations).
        self.pickled = {name: views[name][sl] for name in layout.pickled("obs/", "final_obs/", "act/")}
        self.autoreset = views["autoreset"][sl]
        self.last_return = views["last_return"][sl]
        self.last_length = views["last_length"][sl]
        self.ep_count = views["episode_count"][sl]
        self.current: int | None = None  # global index of the env being served, for error reports
        # Envs whose next step is a reset, mirrored into the shared ``autoreset`` region (which
        # main reads under DISABLED) but read from this list on the hot path.
        self.pending_reset = [False] * len(envs)
        # The running episode's return and length stay in this process, updated once per
        # step for the whole block; only finished episodes are published.
        self.run_return = np.zeros(len(envs), dtype=np.float64)
        self.run_length = np.zeros(len(envs), dtype=np.int64)
        self._pack_rewards = struct.Struct(f"{len(envs)}d").pack_into
        self._pack_flags = struct.Struct(f"{len(envs)}?").pack_into
        self._np = np

    def _targets(self, layout: Regions, views: dict, row: int | None) -> Targets:
        """Views of this block's slice: the regular regions (``row=None``) or rollout row ``row``,
        whose step writes its observation into row ``row + 1``.
        """
        sl = slice(self.start, self.stop)
        if row is None:

            def at(v, shift=0):
                return v[sl]
        else:

            def at(v, shift=0):
                return v[row + shift, sl]

        final = [at(v) for v in layout.leaf_views(views, "final_obs")] if layout.with_final_obs else []
        return Targets(
            [at(v, 1) for v in layout.leaf_views(views, "obs")],
            final,
            [at(v) for v in layout.leaf_views(views, "act")],
            at(views["rewards"]),
            at(views["terminations"]),
            at(views["truncations"]),
        )

    def attach_rollout(self, payload: RolloutPayload) -> None:
        """Step into the rollout segment ``(layout, buffer)`` from now on, one row per step."""
        layout, buf = payload
        views = layout.views(buf)
        self.rows = [self._targets(layout, views, t) for t in range(layout.num_steps)]

    def attach_infos(self, payload: tuple[InfoLayout, Any]) -> None:
        """Write the scalar infos of the schema into the info segment ``(layout, buffer)`` from now on."""
        from shmvec.info_columns import ColumnWriter

        layout, buf = payload
        self.infos.columns = ColumnWriter(layout, buf, slice(self.start, self.stop))

    # -- writing results -------------------------------------------------------------------
    def _write_obs(self, targets: list, j: int, obs: Any) -> None:
        if self.flat_obs:
            self._write_leaf(targets[0], 0, j, obs)
            return
        from shmvec.tree import flatten

        try:
            parts = flatten(self.observation_space, obs)
        except (KeyError, IndexError, TypeError) as exc:
            raise _obs_error(
                f"env {self.start + j} returned an observation that does not match observation_space "
                f"{self.observation_space}: {type(exc).__name__}: {exc}"
            ) from None
        writers = self._writers
        for k, part in enumerate(parts):
            writers[k](targets[k], k, j, part)

    @staticmethod
    def _write_object(target, k: int, j: int, value: Any) -> None:
        # A pickled leaf: Gymnasium batches these as they come (no shape or type to check).
        target[j] = value

    def _write_leaf(self, target, k: int, j: int, value: Any) -> None:
        leaf = self.obs_leaves[k]
        shape = getattr(value, "shape", None)
        if shape is not None and shape != leaf.shape:
            raise _obs_error(
                f"env {self.start + j} returned observation{leaf.field} of shape {shape}, "
                f"expected {leaf.shape} (dtype {leaf.dtype}) from its observation_space"
            )
        dtype = getattr(value, "dtype", None)
        if dtype is not None and dtype != leaf.dtype and not self._np.can_cast(dtype, leaf.dtype, "same_kind"):
            # float into an integer space, say: SyncVectorEnv would cast silently and wrongly.
            raise _obs_error(
                f"env {self.start + j} returned observation{leaf.field} of dtype {dtype}, "
                f"expected {leaf.dtype} (or a dtype that casts to it safely) from its observation_space"
            )
        try:
            target[j] = value
        except (ValueError, TypeError) as exc:
            raise _obs_error(
                f"env {self.start + j} returned observation{leaf.field} {value!r:.80} that does not fit "
                f"shape {leaf.shape}, dtype {leaf.dtype}: {exc}"
            ) from None

    def _write_gathered(self, target, values: list) -> bool:
        """Write one observation per env into ``target`` at once; ``False`` (nothing written)
        if they do not stack into its shape with a safe cast (the caller then writes them one
        by one, which names the env at fault).
        """
        np = self._np
        try:
            stacked = np.array(values)
        except (ValueError, TypeError):
            return False
        dtype = target.dtype
        if stacked.shape != target.shape or (
            stacked.dtype != dtype and not np.can_cast(stacked.dtype, dtype, "same_kind")
        ):
            return False
        target[...] = stacked
        return True

    def _action(self, act: list, j: int) -> Any:
        if self.flat_act:
            a = act[0][j]
            return a if self.act_scalar[0] else a.copy()
        from shmvec.tree import assemble

        parts = [a[j] if scalar else a[j].copy() for a, scalar in zip(act, self.act_scalar)]
        return assemble(self.action_space, parts)

    # -- pickled leaves, for a worker process ------------------------------------------------
    def load_actions(self, payload: ActionPayload) -> None:
        """Take this block's pickled action leaves (``{region name: [n] object array}``)."""
        for name, values in payload.items():
            self.pickled[name][...] = values

    def pickled_results(self, step: bool) -> dict[str, Any]:
        """The block's pickled observation leaves, ``{region name: [n] object array}``, to send
        with the reply of a step (``step``) or reset; after a step, its final observations too.

        The final ones are cleared once taken: only the envs that end an episode in a step
        write one, and the others' stale values need not travel.
        """
        out = {}
        for name, values in self.pickled.items():
            if name.startswith("obs/"):
                out[name] = values
            elif step and name.startswith("final_obs/"):
                out[name] = values.copy()
                values[...] = None
        return out

    # -- commands --------------------------------------------------------------------------
    def step(self, out: Targets | None = None) -> Reports | None:
        """Step every env, reading actions from and writing results to ``out`` (default: the
        regular regions); return ``[(env_index, final_info, info), ...]`` for the envs that
        have something to report (``None`` if none), where ``final_info`` is the step info of an
        episode that ended under same-step autoreset (``None`` when not that case).
        """
        envs, autoreset = self.envs, self.pending_reset
        next_step = self.next_step
        same_step = self.same_step
        # The common case (one Box/Discrete leaf each way) runs inline: per-env Python
        # overhead is what separates a block from a bare loop over the same envs.
        out = self.home if out is None else out
        fast = self.flat_obs and self.flat_act
        gather = fast and self.gather_obs
        if fast:
            obs0, act0, scalar = out.obs[0], out.act[0], self.act_scalar[0]
            shape, dtype, ndarray = self.obs_leaves[0].shape, self.obs_leaves[0].dtype, self._np.ndarray
        n = len(envs)
        gathered: list[Any] = [None] * n if gather else []
        rews = [0.0] * n
        terms = [False] * n
        truncs = [False] * n
        ended: list[int] = []
        resets: list[int] = []
        reports: Reports = []
        route = self.infos
        route.before_step()
        j = 0
        try:
            for j in range(n):
                env = envs[j]
                final_info = None
                if autoreset[j] and next_step:
                    o, info = env.reset()
                    resets.append(j)
                else:
                    if fast:
                        a = act0[j] if scalar else act0[j].copy()
                    else:
                        a = self._action(out.act, j)
                    o, r, te, tr, info = env.step(a)
                    rews[j] = r
                    if te or tr:
                        terms[j] = te
                        truncs[j] = tr
                        ended.append(j)
                        if same_step:
                            o, info, final_info = self._reset_in_step(env, out, j, o, info)
                if gather:
                    gathered[j] = o
                elif fast and type(o) is ndarray and o.dtype == dtype and o.shape == shape:
                    obs0[j] = o
                else:
                    self._write_obs(out.obs, j, o)
                if info or final_info is not None:
                    report = route.step_report(j, info, final_info)
                    if report is not None:
                        reports.append(report)
        except BaseException:
            self.current = self.start + j  # for the error report; free on the hot path
            raise
        self._write_step(out, gathered, rews, terms, truncs)  # (names the env at fault itself)
        self._count_episodes(out.rewards, ended, resets)
        return reports or None

    def _reset_in_step(self, env: Any, out: Targets, j: int, obs: Any, info: Any) -> tuple[Any, Any, dict]:
        """SAME_STEP: write the ended episode's final observation, reset env ``j``; return the new
        episode's observation and info, and the final info (always reported: see InfoMerger.merge).
        """
        self._write_obs(out.final_obs, j, obs)
        final_info = {} if info is None else info
        obs, info = env.reset()
        return obs, info, final_info

    def _write_step(self, out: Targets, gathered: list, rews: list, terms: list, truncs: list) -> None:
        """Write a step's gathered observations (if it gathered them), rewards and flags into ``out``."""
        if gathered and not self._write_gathered(out.obs[0], gathered):
            for j in range(len(gathered)):  # one by one, so that the error names the env
                self.current = self.start + j
                self._write_obs(out.obs, j, gathered[j])
            self.current = None
        raw = out.raw
        try:
            self._pack_rewards(raw[0], 0, *rews)
            self._pack_flags(raw[1], 0, *terms)
            self._pack_flags(raw[2], 0, *truncs)
        except Exception:  # not a float or a truth value: find the env, name it
            self._write_outcomes(out, rews, terms, truncs)

    def _write_outcomes(self, out: Targets, rews: list, terms: list, truncs: list) -> None:
        """Write rewards and flags env by env; raise naming the first env whose value is not a
        scalar (a float reward, a truth value for each flag).
        """
        np = self._np
        for j in range(len(rews)):
            for name, values, target in (
                ("reward", rews, out.rewards),
                ("terminated", terms, out.terminations),
                ("truncated", truncs, out.truncations),
            ):
                value = values[j]
                self.current = self.start + j
                try:
                    if value is None or np.ndim(value) != 0:  # numpy would take None for NaN
                        raise ValueError("not a scalar")
                    target[j] = value
                except (ValueError, TypeError) as exc:
                    raise _obs_error(
                        f"env {self.start + j} returned {name} {value!r:.80}: expected a "
                        f"{'float' if name == 'reward' else 'bool'} scalar ({exc})"
                    ) from None
        self.current = None

    def _count_episodes(self, rewards: Any, ended: list[int], resets: list[int]) -> None:
        """Add a step's ``rewards`` to the running episodes, publish the finished ones, and
        update the autoreset flags.

        ``ended``: block-local envs whose episode ended; ``resets``: those whose step was a
        NEXT_STEP reset (their reward is 0 and their length does not grow).
        """
        self.run_return += rewards
        self.run_length += 1
        if resets:
            for j in resets:
                self.run_length[j] -= 1
                self.pending_reset[j] = False
                self.autoreset[j] = False
        if ended:
            for j in ended:
                self.last_return[j] = self.run_return[j]
                self.last_length[j] = self.run_length[j]
                self.ep_count[j] += 1
                self.run_return[j] = 0.0
                self.run_length[j] = 0
                if not self.same_step:
                    self.pending_reset[j] = True
                    self.autoreset[j] = True

    def reset(self, payload: ResetPayload | None) -> Reports | None:
        """Reset envs; payload is ``(seeds, options, mask)`` for this block or ``None``."""
        seeds, options, mask = payload if payload is not None else (None, None, None)
        reports: Reports | None = None
        for j, env in enumerate(self.envs):
            if mask is not None and not mask[j]:
                continue
            self.current = self.start + j
            kwargs: dict[str, Any] = {}
            if seeds is not None:
                kwargs["seed"] = seeds[j]
            if options is not None:
                kwargs["options"] = options
            o, info = env.reset(**kwargs)
            self._write_obs(self.home.obs, j, o)
            if info:
                if reports is None:
                    reports = []
                reports.append(self.infos.reset_report(j, info))
            self.home.terminations[j] = False
            self.home.truncations[j] = False
            self.autoreset[j] = False
            self.pending_reset[j] = False
            self.run_return[j] = 0.0
            self.run_length[j] = 0
        self.current = None
        return reports

    def call(self, payload: CallPayload) -> list:
        """Call a method (or read an attribute) by name on every env, through wrappers."""
        name, args, kwargs = payload
        results = []
        for j, env in enumerate(self.envs):
            self.current = self.start + j
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        self.current = None
        return results

    def set_attr(self, payload: SetAttrPayload) -> None:
        name, values = payload
        for j, env in enumerate(self.envs):
            self.current = self.start + j
            env.set_wrapper_attr(name, values[j])
        self.current = None

    def get_state(self, offsets: list[int]) -> list[EnvRecord]:
        """The state of the block's envs at ``offsets``: each env's snapshot (:mod:`shmvec.snapshot`)
        with the running episode this block counts for it.
        """
        from shmvec.snapshot import capture

        records = []
        for j in offsets:
            self.current = self.start + j
            blob = capture(self.envs[j], self.start + j)
            records.append((blob, self.pending_reset[j], float(self.run_return[j]), int(self.run_length[j])))
        self.current = None
        return records

    def set_state(self, payload: list[tuple[int, EnvRecord]]) -> None:
        """Restore ``(offset, record)`` pairs that :meth:`get_state` gave (from any env of the vector env)."""
        from shmvec.snapshot import restore

        for j, (blob, pending, episode_return, episode_length) in payload:
            self.current = self.start + j
            restore(self.envs[j], blob, self.start + j)
            self.pending_reset[j] = self.autoreset[j] = pending
            self.run_return[j] = episode_return
            self.run_length[j] = episode_length
        self.current = None

    def close(self, payload: None = None) -> None:
        for j, env in enumerate(self.envs):
            self.current = self.start + j
            env.close()
        self.current = None

    def run(self, cmd: int, payload: Any, arg: int = 0) -> Any:
        """Execute one protocol command; return the reply (``None`` when there is none)."""
        self.current = None  # until an env is at fault
        if cmd == _STEP:
            if payload is not None:  # pickled action leaves (a worker process's block only)
                self.load_actions(payload)
            return self.step()
        if cmd == _ROLLOUT_STEP:
            return self.step(self.rows[arg])
        handler = self._handlers.get(cmd)
        if handler is None:
            raise ValueError(f"unknown command {cmd}")
        return handler(payload)


def build_envs(env_fns: Sequence[Callable[[], Any]], start: int, block: int) -> list | ConstructError | Mismatch:
    """Build the envs of ``block``, env ``start`` first, and check that they share their spaces.

    Returns the envs, or what went wrong as the handshake message that says it (the envs
    built so far are closed then).
    """
    envs = []
    for j, fn in enumerate(env_fns):
        try:
            envs.append(fn())
        except BaseException as exc:
            close_all(envs)
            return ConstructError(error_report(exc, block, start + j, "construct"))
    first = Spaces.of(envs[0])
    for j, env in enumerate(envs[1:], 1):
        why = Spaces.of(env).mismatch(start + j, first, start)
        if why is not None:
            close_all(envs)
            return Mismatch(start + j, why)
    return envs


def close_all(envs: list) -> None:
    """Close each env, whatever the others do (a failed start-up, a shutdown and a restart must go on)."""
    for env in envs:
        try:
            env.close()
        except Exception:
            pass
