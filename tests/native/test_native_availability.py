"""Where the native ops cannot run, available() is False with a one-line reason and nothing raises: the model
keeps the transformers path. These run on every machine (no build needed for the refusals).

Where the CPU could run the native code but its build is unavailable (no compiler, no ninja, a failed build), the
native suites skip, each with the reason; in CI (CI=true) test_the_native_code_builds_where_the_cpu_can_run_it is
then one failure that says why, so CI cannot go green on skips."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.native import build, ops


@pytest.fixture
def fresh_state(monkeypatch):
    """A loader that has not answered yet in this process (the real answer comes back afterwards)."""
    monkeypatch.setattr(ops, "_state", {})


def test_not_x86_64_is_unavailable_with_the_reason(fresh_state, monkeypatch):
    monkeypatch.setattr(ops.platform, "machine", lambda: "aarch64")
    assert ops.available() is False
    assert ops.unavailable_reason() == "not an x86-64 CPU (aarch64)"
    with pytest.raises(RuntimeError, match="unavailable: not an x86-64 CPU"):
        ops.rms_norm(None, None, 1e-6)


def test_no_compiler_is_unavailable_with_the_reason(fresh_state, monkeypatch):
    monkeypatch.setattr(ops.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert ops.available() is False
    assert ops.unavailable_reason() == "no C++ compiler (no-such-compiler-here)"


def test_a_failed_build_is_unavailable_with_the_reason(fresh_state, monkeypatch):
    monkeypatch.setattr(ops.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "load_extension", lambda *a, **k: build.Loaded(None, "its build failed (boom)"))
    assert ops.available() is False
    assert ops.unavailable_reason() == "its build failed (boom)"


@pytest.mark.parametrize("env,paths,best,chosen,warned", [
    (None, ("avx2", "avx512"), "avx512", "avx512", ""),
    ("avx2", ("avx2", "avx512"), "avx512", "avx2", ""),
    ("AVX2", ("avx2", "avx512", "amx"), "amx", "avx2", ""),
    ("avx512", ("avx2", "avx512", "amx"), "amx", "avx512", ""),  # AMX's tiles off
    ("amx", ("avx2", "avx512", "amx"), "amx", "amx", ""),
    ("amx", ("avx2", "avx512"), "avx512", "avx512", ""),  # the ops have no AMX path: their best below it
    ("amx", ("avx2", "avx512", "amx"), "avx512", "avx512", "cannot run it (its best: avx512)"),
    ("amx", ("avx2", "avx512"), "avx2", "avx2", "cannot run it (its best: avx2)"),
    ("avx512", ("avx2", "avx512"), "avx2", "avx2", "cannot run it (its best: avx2)"),
    ("sse9", ("avx2", "avx512"), "avx512", "avx512", "not one of avx2, avx512, amx"),
    ("", ("avx2", "avx512"), "avx2", "avx2", ""),
])
def test_specdec_native_isa_has_one_meaning(env, paths, best, chosen, warned, monkeypatch, caplog):
    """build.native_isa, what both extensions apply at load: the highest path SPECDEC_NATIVE_ISA allows that the CPU
    runs; a name it does not know or one the CPU cannot run is one warning line (said once per process) and the
    CPU's best."""
    monkeypatch.setattr(build, "_isa_warnings", set())
    if env is None:
        monkeypatch.delenv(build.ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(build.ISA_ENV, env)
    with caplog.at_level("WARNING", logger="specdec.native"):
        assert build.native_isa(paths, best) == chosen
        assert build.native_isa(paths, best) == chosen
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if warned:
        assert len(lines) == 1 and warned in lines[0] and lines[0].startswith(f"SPECDEC_NATIVE_ISA={env} ignored")
        assert "\n" not in lines[0]
    else:
        assert lines == []


def run_with_isa(value: str):
    """A process started with SPECDEC_NATIVE_ISA=value that loads both extensions and prints the paths they run on
    and the best ones this CPU runs: (ops isa, ops cpu isa, w4a8 isa, w4a8 cpu isa), its stderr's lines."""
    from specdec.models import w4a8

    if not ops.available() or w4a8.load() is None:  # built here first: the child only loads them
        pytest.skip(f"the native code cannot run here: {ops.unavailable_reason() or w4a8.unavailable_reason()}")
    code = ("from specdec.models import w4a8; from specdec.native import ops; "
            "print(ops.isa(), ops.cpu_isa(), w4a8.isa(), w4a8.cpu_isa())")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, build.ISA_ENV: value},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr  # a path the CPU lacks would be SIGILL (-4)
    return done.stdout.split(), [line for line in done.stderr.splitlines() if line.strip()]


def test_an_unknown_isa_in_the_environment_is_one_warning_line_and_the_cpus_best():
    (ops_isa, ops_best, mm_isa, mm_best), stderr = run_with_isa("sse9")
    assert (ops_isa, mm_isa) == (ops_best, mm_best)
    assert stderr == ["SPECDEC_NATIVE_ISA=sse9 ignored: not one of avx2, avx512, amx; the native code runs on the "
                      "CPU's best path"]


def test_a_path_the_cpu_lacks_is_one_warning_line_and_the_cpus_best():
    """amx on a CPU without AMX (this one's case), avx512 on an AVX2-only one: never an instruction the CPU lacks."""
    from specdec.models import w4a8

    if not ops.available() or w4a8.load() is None:
        pytest.skip(f"the native code cannot run here: {ops.unavailable_reason() or w4a8.unavailable_reason()}")
    best = w4a8.cpu_isa()
    if best == build.ISAS[-1]:
        pytest.skip(f"this CPU runs every path the matmuls have ({best}): none it lacks to name")
    lacking = build.ISAS[build.ISAS.index(best) + 1]
    (ops_isa, ops_best, mm_isa, mm_best), stderr = run_with_isa(lacking)
    assert (ops_isa, mm_isa) == (ops_best, mm_best) == (ops.cpu_isa(), best)
    assert stderr == [f"SPECDEC_NATIVE_ISA={lacking} ignored: this CPU cannot run it (its best: {best}); the native "
                      f"code runs on {best}"]


def in_ci() -> bool:
    """CI=true (GitHub Actions, GitLab, most CI services set it; 1 and yes count too)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def build_problem() -> str:
    """Why the native code does not run on a CPU that could run it (no compiler or ninja, a failed or timed-out
    build: the native suites then skip), or ''. Not a build problem: a CPU that is not x86-64 or lacks AVX2 + FMA,
    SPECDEC_W4A8=0 (the kernels switched off on purpose)."""
    from specdec.models import w4a8

    if platform.machine().lower() not in ("x86_64", "amd64") or not w4a8.CPU_FLAGS <= w4a8.cpu_flags():
        return ""
    problems = [reason for reason in (ops.unavailable_reason(), w4a8.unavailable_reason())
                if reason and "SPECDEC_W4A8=0" not in reason]
    return "; ".join(dict.fromkeys(problems))


def test_the_native_code_builds_where_the_cpu_can_run_it():
    """One test for the whole native suite: on a developer's machine without a compiler it skips with the build's
    reason, as the suites' tests do; in CI it fails with it, so missing native coverage is red, not ~170 skips."""
    problem = build_problem()
    if problem and in_ci():
        pytest.fail(f"CI=true and the native build is unavailable on a CPU that could run it: {problem} (the native "
                    "suites skipped)", pytrace=False)
    if problem:
        pytest.skip(f"the native build is unavailable here (in CI this fails): {problem}")
    if not ops.available():
        pytest.skip(f"the native code cannot run on this machine: {ops.unavailable_reason()}")


@pytest.mark.parametrize("ci", [True, False], ids=["ci", "developer"])
def test_without_a_compiler_ci_fails_once_and_a_developer_run_skips(ci, tmp_path):
    """A pytest run of the gate above and a native suite, without a compiler (CXX names none): with CI=true one
    failure naming the reason and the suite's tests skipped; without CI, all skipped with the reason."""
    from specdec.models import w4a8

    if platform.machine().lower() not in ("x86_64", "amd64") or not w4a8.CPU_FLAGS <= w4a8.cpu_flags():
        pytest.skip("this CPU cannot run the native code: no build problem to report")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(CXX=str(tmp_path / "no-compiler"), TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"),
               **({"CI": "true"} if ci else {}))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider",
         "tests/native/test_native_availability.py::test_the_native_code_builds_where_the_cpu_can_run_it",
         "tests/native/test_native_fused_norm.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    reason = f"no C++ compiler ({tmp_path / 'no-compiler'})"
    summary = done.stdout.strip().splitlines()[-1]
    if ci:
        assert done.returncode == 1, done.stdout[-3000:]
        assert summary.startswith("1 failed, ") and "skipped" in summary and "passed" not in summary, summary
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        assert len(failed) == 1 and "test_the_native_code_builds_where_the_cpu_can_run_it" in failed[0], failed
        assert reason in failed[0], failed
    else:
        assert done.returncode == 0, done.stdout[-3000:]
        assert "failed" not in summary and "passed" not in summary and "skipped" in summary, summary
        assert f"the native build is unavailable here (in CI this fails): {reason}" in done.stdout
