"""The tests mirror the packages: tests/<package>/ tests empo2_jax/<package>/ (agent, baselines,
data, envs, memory, methods, model, parallel, programs, rl, sampling, train); tests/core/ the
top-level modules, the package and its layering; tests/launch/ the command lines of launch/,
scripts/ and bench/; tests/integration/ whole runs (a Trainer, several processes, the metrics pin);
tests/helpers/ fakes, shared settings, subprocess workers and the toy method. `make test` runs all
but the @pytest.mark.slow ones; `make test-all` runs every test.
"""
