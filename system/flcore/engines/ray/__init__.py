"""The Ray engine (``--engine ray``): the cohort trained by Ray actors, on this machine or a cluster,
with the sequential engine's numbers.

It is one more engine on the local-training protocol: every client still runs the sequence of
:mod:`flcore.clients.clientbase` (``plan_job``, ``open_job``, ``train_job``, ``finish_job``), only
inside an actor instead of the driver. Per round, the driver sends each actor one message and gets
one back; aggregation stays on the driver, in client-id order, so results are bit-identical to the
sequential engine's on the CPU (``tests/engines/test_ray.py`` compares every array of the h5).

* **Actors** (``--ray_workers``, default: one per ``--ray_cpus_per_worker`` CPUs of the cluster,
  of at most ``--num_threads`` CPUs on a local instance when that is set, at least one) each hold
  one working model and the clients assigned to them: the clients' data are put into Ray's object
  store once, when the actor is built, never per round. Inside an actor the clients
  are trained by the threaded engine when it has several CPUs (``--ray_cpus_per_worker 2`` and up),
  else sequentially; an actor with a GPU (``--ray_gpus_per_worker``, fractions allowed) trains
  sequentially on it (the batched engine needs the whole dataset).
* **Assignment** is sticky and balanced by samples: clients, longest first, each go to the actor
  with the fewest samples so far (longest processing time first, as pfl-research balances its
  workers). It is computed once from the clients' sizes, so a client always trains on the same
  actor, and a replaced actor takes over its predecessor's clients.
* **Per-client state** (control variates, personal models, private parts) lives in the store of
  the actor that owns the client; algorithm code calls ``self.state.get/set`` unchanged. The
  driver's ``server.state`` is a :class:`DriverStateStore`: the last completed round's copy of
  every client's state, kept in anonymous files (a :class:`~flcore.state.DiskStateStore`), so the
  driver's memory does not grow with the number of stateful clients. Each actor's round message
  carries the entries its clients changed; what the server itself sets (FedALA's local models,
  IGFL's stored updates, ``setup``'s initial personal models) is pushed to the owning actor with
  the next round's message. The server reads state (evaluating personal models) from that copy,
  and a checkpoint's ``state_dict``/``load_state_dict`` of ``server.state`` gathers and scatters
  the whole cluster's state through it.
* **Client attributes** follow the client-state contract (``Client.carried`` and ``settable``,
  ``flcore/clients/clientbase.py``): an actor builds its clients with the driver's ``settings()``
  (what the server set in ``setup``: slowness, FedGen's generator, FedLC's counts); each round's
  message carries the ``carried_state()`` of the clients it trains (participations, DP-SGD's step
  counts) and the answer carries it back, set on the driver's clients, so server code that reads
  them sees what it sees sequentially. Nothing else of a client travels.
* **Same numbers.** A client's result depends only on its start point, batch plan, context and
  state, all of which derive from (seed, round, client) and the package; the driver orders the
  updates by cohort position, leaves its working model and global RNG where the sequential engine
  leaves them (the last cohort client's final model and RNG), and aggregates as usual. Actors use
  one intra-op thread per training thread, so the numbers are those of ``--engine sequential
  --num_threads 1``, as the threaded engine's are. An actor does not pre-sum its uploads: a
  weighted sum formed on the actor would add in another order than the driver's client-id order
  and round differently.
* **Faults.** An actor that dies mid-round (killed, out of memory, its node lost) is replaced: the
  new actor gets the same clients, their state from the driver's copy of the last round and their
  attributes from the driver, and reruns the round's jobs with the same (seed, round, client)
  randomness, so the run's results equal an undisturbed run's. More than ``--ray_max_restarts``
  failures in one round stop the run with one line (:class:`WorkersLost`, a ``Diverged``: ``main``
  writes the rounds recorded so far, marked unfinished, and ``--resume`` continues from the last
  checkpoint).
* **Network.** With the default ``--ray_address local`` the engine starts a Ray instance bound to
  127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before ``ray.init``: measured with ray
  2.60.0, ``_node_ip_address`` alone did not move the GCS), without the dashboard, with an object
  store sized to the data. ``auto`` or ``ray://host:port`` attach to a running cluster
  (``docs/scale-out.md``); the code must be at the same path on every node.
* **Kept actors** (opt-in, :func:`~flcore.engines.ray.warm.keep_actors_warm`): a process that runs
  many short runs on a Ray instance it started itself (a notebook's sweep, the test suite) keeps a
  finished run's actors, emptied, and rebuilds them in place for the next run instead of starting
  new processes; the numbers are those of new actors (``tests/engines/test_ray.py``).
* **Testing faults.** The actors are instances of ``RayEngine.worker_cls``
  (:class:`~flcore.engines.ray.worker.TrainingWorker`); the tests replace it with a subclass that
  exits mid-round (``tests/system/raycrash.py``), so production code holds no fault injection.

The package, by concern: ``cluster`` (starting or attaching to Ray, on loopback), ``transfer``
(what travels between driver and actors, and the two state stores), ``worker`` (the actor's
body), ``engine`` (the driver: assignment, rounds, replacement of failed actors), ``warm`` (actors
kept between runs).
"""
from flcore.engines.ray.cluster import (actor_path_env, check_ray_installed, first_line, import_ray,  # noqa: F401
                                       start_local_ray, use_loopback)
from flcore.engines.ray.engine import RayEngine, WorkersLost, assign_by_samples  # noqa: F401
from flcore.engines.ray.warm import keep_actors_warm, release_warm_actors  # noqa: F401
