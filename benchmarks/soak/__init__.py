"""The swarm run as a swarm: a soak of real processes with chaos, measured against the scale model.

    python -m benchmarks.soak --minutes 60          # 12 training nodes + 36 light peers, 48 peers
    python -m benchmarks.soak --quick               # 8 peers for 5 minutes (the slow CI step runs it)

`plan.py` says what runs, `run.py` runs it (processes, chaos schedule, sampling), `light_peers.py`
is the torch-free process of many light DHT peers, `report.py` turns the run directory into the
JSON line and plots. A training node that exits by itself (one that could not join the start-up
storm, with its one-line error) is started again 10 s later, as deploy/compose.yaml's
`restart: unless-stopped` would (`exited`, then `supervised_restart` in the events).
"""
