"""What the tests (tests/) and the benchmarks (bench/) share: workspaces that run the real
pipeline (workspace.py), the token-leak watch (process_watch.py), results built once per test
run for every worker (built_once.py), and the xdist scheduler plugin (xdist_schedule.py)."""
