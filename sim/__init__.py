"""The site simulator: a large site (hundreds of GPUs, a day of job waves) in simulated time,
driven by the project's own policies, and by the reference chart's for comparison.

Engine: SimPy. It is maintained (4.x, pure Python, no compiled parts to build here), its
processes are plain generators, so a job, a server's batcher or the operator's loop reads
as the code it models, and its clock is a number the policies take as `now`: the admission
rule, the autoscaler and the load view run unchanged at simulated time. One simulated
request is one client batch (many events), so that a day of a large site runs in minutes.

Modules, one job each:

- `scenario.py`: what a scenario holds (site, pool with its sweep of GPU counts, models,
  workflows with their own calls); shipped scenarios under `scenarios/`; faults (`FAULTS`:
  a Prometheus outage, a lost node) at their times. `scenario_parse.py`: the YAML read and
  checked, each error naming its file and field (`scenario_fields.py`: one field's reader,
  and the YAML with no key given twice; `scenario_pool.py`: the pool's and the faults').
- `gpu.py`: a GPU server: per model Triton's dynamic batcher (max batch, queue delay), one
  execution at a time, and Triton's counters as the operator scrapes them.
- `envoy.py`: Envoy's LEAST_REQUEST pick (with equal weights power of two choices, or the
  least busy of all with `FULL_SCAN`; earliest deadline first over weight / (active + 1)
  otherwise): Envoy's, modelled here.
- `policies.py`: the `sonicsite` policy set (the operator's load view, balancing weights,
  admission and pool-scaling decision, called as the operator calls them); `reference.py`:
  the `reference` set (SuperSONIC's chart defaults), whose autoscaling is Kubernetes' HPA
  and KEDA's activation, modelled in `hpa.py`.
- `placing.py`: models placed on demand (a scenario's `placement`): the operator's
  placement policy each step, its loads and unloads carried out at simulated time with the
  operator's actuator's checks at each turn, and the requests held for a model that no
  server has ready.
- `site.py`: the pool of servers: slots by GPU kind, pod start and model load, drain.
- `workload.py`: CRAB-like waves of jobs; a job's CPU time and its requests, with the
  client's retry-after and back-off.
- `run.py`: one scenario under one policy set; `results.py`: the comparisons, seeds and
  sweep, run in worker processes, and the JSON; `plots.py`: the plots; `commands.py`:
  `sonicsite simulate`; `output.py`: files written whole, at a symlink's target, never over
  a device or a FIFO (the benches' results and report too).
"""
