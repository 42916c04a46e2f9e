"""``RayVecEnv``: shmvec's API across the machines of a Ray cluster, one ``ShmVecEnv`` per actor.

Each Ray actor hosts a :class:`~shmvec.ShmVecEnv` over a contiguous block of the envs (its own
worker processes, its own shared memory); the driver talks to the actors through Ray only. Work
moves at the granularity that pays over a network: a whole :meth:`RayVecEnv.rollout`, with the
policy running on the actors, next to their envs. The per-step ``VectorEnv`` API works too, at
the price of one Ray round trip per step.

Ray is an optional extra (``pip install 'shmvec[ray]'``); only this module imports it.

Example
-------
>>> import ray, numpy as np                                            # doctest: +SKIP
>>> from shmvec.ray import RayVecEnv                                   # doctest: +SKIP
>>> ray.init(address="auto")               # or ray.init(num_cpus=4) # doctest: +SKIP
>>> envs = RayVecEnv([lambda: gym.make("CartPole-v1")] * 256,
...                  num_actors=4, num_workers_per_actor=8)            # doctest: +SKIP
>>> obs, infos = envs.reset(seed=0)                                    # doctest: +SKIP
>>> batch = envs.rollout(lambda obs: (obs[:, 2] > 0).astype(np.int64), num_steps=128)  # doctest: +SKIP
>>> batch["rewards"].shape                                             # doctest: +SKIP
(128, 256)
>>> envs.close()                                                       # doctest: +SKIP
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from shmvec.batched_spaces import BatchedSpace

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("shmvec.ray needs Ray: pip install 'shmvec[ray]' (or pip install ray)") from exc

from shmvec.actions import ActionBatch
from shmvec.blocks import set_attr_payloads, split
from shmvec.checks import env_factories, parse_autoreset_mode, positive_int, seeds_per_env
from shmvec.errors import ActorDied, ShmVecError, StepTimeout, WorkerError
from shmvec.infos import concat_infos
from shmvec.lifecycle import Lifecycle, refuse
from shmvec.options import passed_on
from shmvec.protocol import Command, Spaces
from shmvec.tree import assemble, flatten, space_leaves

# The commands that step or reset the envs: an env's failure there leaves them out of step with
# the other actors' (read from a report's command code), so the vector env closes.
_STEPPING = {Command.STEP, Command.RESET, Command.ROLLOUT_STEP}

__all__ = ["EnvHost", "RayVecEnv"]

# Options of the actors' ShmVecEnv that RayVecEnv decides itself, and what to use instead.
_FIXED = {
    "num_workers": "use num_workers_per_actor",
    "batch_size": "asynchronous collection is not supported across actors",
}


def _spaces(info: dict[str, Any]) -> Spaces:
    """The spaces an actor described, as the handshake record that compares them."""
    return Spaces(info["single_observation_space"], info["single_action_space"], info["metadata"], None)


class EnvHost:
    """What each actor runs: a :class:`~shmvec.ShmVecEnv` over its envs, and the rollout policy."""

    def __init__(self, env_fns: list, num_workers: int, vector_kwargs: dict[str, Any]) -> None:
        from shmvec.vector_env import ShmVecEnv

        # A Ray worker is a threaded process (gRPC): forking it is unsafe, so its workers come
        # from a fork server unless the caller chose otherwise.
        vector_kwargs.setdefault("context", "forkserver")
        self.policy: Callable[[Any], Any] | None = None
        # A constructor that raised would leave Ray only "the actor died" to report: keep the
        # error and raise it from describe(), with its own type and remote traceback.
        self.error: BaseException | None = None
        try:
            self.env = ShmVecEnv(env_fns, num_workers=num_workers, **vector_kwargs)
        except Exception as exc:
            self.error = exc

    def describe(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        env = self.env
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "worker_pids": env.worker_pids,
            "single_observation_space": env.single_observation_space,
            "single_action_space": env.single_action_space,
            "metadata": env.metadata,
            "render_mode": env.render_mode,
        }

    def reset(self, seeds: list | None, options: dict | None) -> tuple:
        return self.env.reset(seed=seeds, options=options)

    def step(self, actions: Any) -> tuple:
        return self.env.step(actions)

    def set_policy(self, policy: Callable[[Any], Any]) -> None:
        self.policy = policy

    def rollout(self, num_steps: int) -> dict[str, Any]:
        # The batch holds views of the rollout storage: Ray copies them into its object store
        # as this method returns, before anything can overwrite them.
        assert self.policy is not None  # RayVecEnv.rollout refuses to run before set_policy
        return self.env.rollout(self.policy, num_steps)

    def call(self, name: str, args: tuple, kwargs: dict) -> tuple:
        return self.env.call(name, *args, **kwargs)

    def set_attr(self, name: str, values: list) -> None:
        self.env.set_attr(name, values)

    def stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        env = self.env
        return env.episode_returns, env.episode_lengths, env.episode_counts

    def close(self) -> None:
        if self.error is None:
            self.env.close()


_RemoteHost = ray.remote(EnvHost)


class RayVecEnv(VectorEnv):
    """A vector env whose envs live in Ray actors, each a :class:`~shmvec.ShmVecEnv` of its block.

    Env ids and seeds are global: env ``i`` is ``env_fns[i]`` and ``reset(seed=s)`` seeds it with
    ``s + i`` whichever actor hosts it, so a :meth:`rollout` equals a local
    ``ShmVecEnv.rollout`` with the same factories, seeds and (per-env deterministic) policy.

    Parameters
    ----------
    env_fns : sequence of callables
        Env factories, pickled to the actors (lambdas and closures are fine). On a real cluster
        every node needs shmvec and the envs' packages installed.
    num_actors : int, optional
        Actors to spread the envs over (contiguous blocks, larger ones first). Default: the
        cluster's CPUs divided by ``num_workers_per_actor``, at most ``len(env_fns)``.
    num_workers_per_actor : int, default 1
        ``num_workers`` of each actor's ShmVecEnv: worker processes of the actor, each stepping a
        block of its envs (``step_in_main=True`` adds one more block, which the actor steps itself).
    actor_options : dict, optional
        Ray actor options; default ``{"num_cpus": num_workers_per_actor, "scheduling_strategy":
        "SPREAD"}`` (one actor per node where the cluster allows).
    autoreset_mode : AutoresetMode or str, default NEXT_STEP
        NEXT_STEP or SAME_STEP (DISABLED, which needs per-env resets, is not supported).
    validate_actions : bool, default True
        Check the actions of :meth:`step` in the driver, with global env indices in the message.
    timeout : float, optional
        Seconds any call to the actors may take before :class:`~shmvec.StepTimeout` (``None``:
        no limit; a dead actor is still reported at once).
    ready_timeout : float, default 120
        Seconds the actors may take to be placed and build their envs.
    **vector_kwargs
        Any other :class:`~shmvec.ShmVecEnv` option (:class:`shmvec.options.Options`), passed to
        every actor's ShmVecEnv, but ``num_workers`` and ``batch_size`` (a ``TypeError`` says why).

    Raises
    ------
    ActorDied
        From any call, when an actor (or its node) died; the vector env is closed.
    """

    observation_space = BatchedSpace("single_observation_space")
    action_space = BatchedSpace("single_action_space")

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        num_actors: int | None = None,
        num_workers_per_actor: int = 1,
        actor_options: dict[str, Any] | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        validate_actions: bool = True,
        timeout: float | None = None,
        ready_timeout: float = 120.0,
        **vector_kwargs: Any,
    ) -> None:
        super().__init__()
        self._actors: list[Any] = []
        self._state = Lifecycle.NEEDS_RESET
        self._finalizer = weakref.finalize(self, _kill, self._actors)
        env_fns = env_factories(env_fns, "RayVecEnv")
        passed_on("RayVecEnv", vector_kwargs, _FIXED)
        mode = parse_autoreset_mode(autoreset_mode)
        if mode is AutoresetMode.DISABLED:
            raise ValueError("RayVecEnv supports autoreset modes NEXT_STEP and SAME_STEP, not DISABLED")
        num_workers_per_actor = positive_int(num_workers_per_actor, "num_workers_per_actor")
        if not ray.is_initialized():
            ray.init()  # what Ray itself does on a first remote call: a local cluster
        self.num_envs = len(env_fns)
        self.autoreset_mode = mode
        self.timeout = timeout
        options = {"num_cpus": num_workers_per_actor, "scheduling_strategy": "SPREAD", **(actor_options or {})}
        if num_actors is None:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            num_actors = max(1, cpus // max(1, int(np.ceil(options["num_cpus"] or 1))))
        self.num_actors = min(positive_int(num_actors, "num_actors"), self.num_envs)
        self.num_workers_per_actor = num_workers_per_actor
        self._check_placeable(options)
        self.blocks = split(self.num_envs, self.num_actors)
        self._sizes = [len(b) for b in self.blocks]
        kwargs = dict(vector_kwargs, autoreset_mode=mode)
        for block in self.blocks:
            workers = min(num_workers_per_actor, len(block))
            self._actors.append(
                _RemoteHost.options(**options).remote(env_fns[block.start : block.stop], workers, dict(kwargs))
            )
        # What each actor described (see EnvHost.describe); placeholders until they answer.
        self._info: list[dict[str, Any]] = [{"node_ip": "?", "node_id": "?"} for _ in self._actors]
        self._info = self._wait_ready(ready_timeout, options)
        first = self._info[0]
        for k, info in enumerate(self._info[1:], 1):
            why = _spaces(info).mismatch(self.blocks[k].start, _spaces(first), 0)
            if why is not None:
                self.close()
                raise ValueError(f"{why} (Ray actor {k})")
        self.single_observation_space = first["single_observation_space"]
        self.single_action_space = first["single_action_space"]
        self.metadata = dict(first["metadata"])
        self.render_mode = first["render_mode"]
        self._actions = ActionBatch(self.single_action_space, validate_actions)
        self._policy_set = False

    # -- set-up ----------------------------------------------------------------------------
    def _check_placeable(self, options: dict[str, Any]) -> None:
        cpus = options.get("num_cpus") or 0
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        largest = max((n.get("Resources", {}).get("CPU", 0.0) for n in nodes), default=0.0)
        if cpus > largest:
            raise ValueError(
                f"each actor asks for num_cpus={cpus}, but the largest node of this Ray cluster has "
                f"{largest:g} CPUs: lower num_workers_per_actor or pass actor_options={{'num_cpus': ...}}"
            )

    def _wait_ready(self, timeout: float, options: dict[str, Any]) -> list[dict[str, Any]]:
        refs = [a.describe.remote() for a in self._actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            late = [refs.index(r) for r in pending]
            self.close()
            raise ShmVecError(
                f"Ray actor(s) {late} were not ready within {timeout:g} s: each asks for {options}, "
                f"the cluster has {ray.available_resources().get('CPU', 0):g} CPUs free. Are there "
                "enough CPUs for num_actors x num_workers_per_actor?"
            )
        return self._get(refs, "construction")

    # -- talking to the actors -------------------------------------------------------------
    def _get(self, refs: list, what: str, closes_on_error: bool = True) -> list:
        """The results of one call per actor, in actor order; a dead actor becomes ActorDied."""
        out = []
        k = 0
        try:
            for k, ref in enumerate(refs):  # noqa: B007 (k names the actor at fault below)
                out.append(ray.get(ref, timeout=self.timeout))
        except RayActorError as exc:
            info = self._info[k]
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            error = ActorDied(k, self.blocks[k], info["node_ip"], info["node_id"], f"during {what}: {cause}")
            self.close()
            raise error from None
        except GetTimeoutError:
            self.close()
            raise StepTimeout(
                f"Ray actor {k} (envs {self.blocks[k].start}..{self.blocks[k].stop - 1}) did not "
                f"finish {what} within timeout={self.timeout} s; the vector env was closed"
            ) from None
        except WorkerError as exc:
            # Ray re-raises it with its own type; its env index is the actor's own: make it global.
            report = dict(getattr(exc, "cause", exc).report)
            if report["env_index"] is not None:
                report["env_index"] += self.blocks[k].start
            report["phase"] = f"{report['phase']} in Ray actor {k} on node {self._info[k]['node_ip']}"
            if closes_on_error or report["command"] in _STEPPING:
                self.close()
            raise WorkerError(report) from None
        except BaseException:
            # An error of the policy (or of an argument) inside an actor, with its own type and the
            # remote traceback: the other actors went on, so the envs are out of step.
            if closes_on_error:
                self.close()
            raise
        return out

    def _each(
        self,
        method: str,
        args_per_actor: list[tuple] | None = None,
        what: str | None = None,
        closes_on_error: bool = True,
    ) -> list:
        if self._state is Lifecycle.CLOSED:
            refuse(self._state, "RayVecEnv", what or method, needs_reset=False)
        args = args_per_actor or [()] * len(self._actors)
        refs = [getattr(a, method).remote(*arg) for a, arg in zip(self._actors, args)]
        return self._get(refs, what or method, closes_on_error)

    # -- joining the actors' results ---------------------------------------------------------
    def _join(self, space: gym.Space, parts: list, axis: int) -> Any:
        """Concatenate per-actor (nested) batches of ``space`` along the env axis (a pickled
        leaf, batched as a tuple of one object per env, by joining the tuples).
        """
        leaves = [flatten(space, p) for p in parts]
        return assemble(
            space,
            [
                tuple(x for p in leaves for x in p[i])
                if leaf.pickled
                else np.concatenate([p[i] for p in leaves], axis=axis)
                for i, leaf in enumerate(space_leaves(space))
            ],
        )

    def _join_infos(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(parts):
            return {}
        return concat_infos(parts, self._sizes)

    # -- the VectorEnv API ---------------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env; ``seed=int`` seeds env ``i`` with ``seed + i``, as Gymnasium does."""
        if options is not None and "reset_mask" in options:
            raise ValueError(
                "RayVecEnv does not take options['reset_mask']: its envs autoreset (NEXT_STEP or "
                "SAME_STEP), so reset() resets them all"
            )
        seeds = seeds_per_env(seed, self.num_envs)
        args = [(None if seeds is None else seeds[b.start : b.stop], options) for b in self.blocks]
        parts = self._each("reset", args)
        self._state = Lifecycle.READY
        obs = self._join(self.single_observation_space, [p[0] for p in parts], 0)
        return obs, self._join_infos([p[1] for p in parts])

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env (one Ray round trip: prefer :meth:`rollout` for throughput)."""
        self._check_ready("step")
        leaves = self._actions.leaf_arrays(actions, self.num_envs)
        args = [(assemble(self.single_action_space, [a[b.start : b.stop] for a in leaves]),) for b in self.blocks]
        parts = self._each("step", args)
        obs = self._join(self.single_observation_space, [p[0] for p in parts], 0)
        rewards, terminations, truncations = (np.concatenate([p[i] for p in parts]) for i in (1, 2, 3))
        return obs, rewards, terminations, truncations, self._join_infos([p[4] for p in parts])

    def set_policy(self, policy: Callable[[Any], Any]) -> None:
        """Send ``policy`` (weights included) to every actor: put once in Ray's object store,
        fetched by each actor. Call it once per policy update; :meth:`rollout` uses it.
        """
        if not callable(policy):
            raise TypeError(f"policy must be callable (obs -> actions), got {type(policy).__name__}")
        refuse(self._state, "RayVecEnv", "set_policy", needs_reset=False)
        try:
            ref = ray.put(policy)
        except Exception as exc:
            raise TypeError(f"the policy cannot be sent to the actors: {type(exc).__name__}: {exc}") from exc
        self._each("set_policy", [(ref,)] * len(self._actors), "set_policy", closes_on_error=False)
        self._policy_set = True

    def rollout(self, policy: Callable[[Any], Any] | None = None, num_steps: int = 128) -> dict[str, Any]:
        """Collect ``num_steps`` steps of every env, the policy running on the actors.

        ``policy`` is as for :meth:`ShmVecEnv.rollout`; passing one broadcasts it first (see
        :meth:`set_policy`), ``None`` reuses the last one. Returns the same dict as
        ``ShmVecEnv.rollout``, over all ``num_envs`` envs in global order; its arrays are the
        caller's own (not views of any storage).
        """
        self._check_ready("rollout")
        num_steps = positive_int(num_steps, "rollout(num_steps=...)")
        if policy is not None:
            self.set_policy(policy)
        if not self._policy_set:
            raise ValueError("rollout() needs a policy: pass one, or call set_policy() first")
        parts = self._each("rollout", [(num_steps,)] * len(self._actors))
        batch: dict[str, Any] = {}
        for key in parts[0]:
            values = [p[key] for p in parts]
            if key == "infos":
                batch[key] = [self._join_infos([v[t] for v in values]) for t in range(num_steps)]
            elif key in ("obs", "final_obs"):
                batch[key] = self._join(self.single_observation_space, values, 1)
            elif key == "next_obs":
                batch[key] = self._join(self.single_observation_space, values, 0)
            elif key == "actions":
                batch[key] = self._join(self.single_action_space, values, 1)
            else:
                batch[key] = np.concatenate(values, axis=1)
        return batch

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or read the attribute), in env order."""
        parts = self._each("call", [(name, args, kwargs)] * len(self._actors), f"call({name!r})", closes_on_error=False)
        return tuple(x for part in parts for x in part)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute ``name`` of every env: one value for all, or one per env."""
        payloads = set_attr_payloads(name, values, self.blocks)
        self._each("set_attr", payloads, f"set_attr({name!r})", closes_on_error=False)

    def render(self) -> tuple[Any, ...]:
        """The frames rendered by every env."""
        return self.call("render")

    @property
    def actor_nodes(self) -> list[str]:
        """The IP address of the node each actor runs on."""
        return [info["node_ip"] for info in self._info]

    @property
    def episode_returns(self) -> np.ndarray:
        """Return of each env's last finished episode (0 until one finishes)."""
        return np.concatenate([s[0] for s in self._each("stats")])

    @property
    def episode_lengths(self) -> np.ndarray:
        """Length of each env's last finished episode (0 until one finishes)."""
        return np.concatenate([s[1] for s in self._each("stats")])

    @property
    def episode_counts(self) -> np.ndarray:
        """Number of finished episodes per env."""
        return np.concatenate([s[2] for s in self._each("stats")])

    def _check_ready(self, what: str) -> None:
        refuse(self._state, "RayVecEnv", what, needs_reset=True)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every actor's envs and workers, then end the actors (idempotent)."""
        self._state = Lifecycle.CLOSED
        refs = []
        for actor in self._actors:
            try:
                refs.append(actor.close.remote())
            except Exception:
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=10.0)
        self._finalizer()

    def __enter__(self) -> RayVecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _kill(actors: list) -> None:
    """End the actors by force (after close, on garbage collection, at exit)."""
    if not ray.is_initialized():  # Ray is down, its actors with it; ray.kill would start a new cluster
        actors.clear()
        return
    while actors:
        actor = actors.pop()
        try:
            ray.kill(actor)
        except Exception:
            pass
