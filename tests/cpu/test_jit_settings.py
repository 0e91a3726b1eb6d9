"""The JIT's settings (issue 10, items 3 and 6): ``configure(...)`` keywords, the REPLAYSSM_*
environment variables, arch validation, and how ``python -m replayssm info`` reports bad values.

Every bad value raises one error that names the keyword or variable, says what is accepted and
shows what came; nothing is guessed at, and nothing needs a GPU or nvcc here.
"""

from __future__ import annotations

import inspect
import io
import logging
import os
import re
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from replayssm import cli
from replayssm.jit import SettingsError, SettingsTypeError, ToolchainError, env
from replayssm.jit import builder as jb

from .conftest import PYTHON, REPO, subprocess_env
from .test_parallel_builds import fake_toolchain

ENV_VARS = (
    "REPLAYSSM_CACHE_DIR",
    "REPLAYSSM_CUDA_ARCH_LIST",
    "REPLAYSSM_DISABLE_JIT",
    "REPLAYSSM_MAX_JOBS",
    "REPLAYSSM_AOT_DIR",
)


@pytest.fixture
def from_env(monkeypatch, tmp_path):
    """Settings not read yet (restored afterwards), no REPLAYSSM_* variable but a private cache;
    the test sets the variables it wants before the settings are first read."""
    monkeypatch.setattr(env, "_settings", None)
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("REPLAYSSM_CACHE_DIR", str(tmp_path / "cache"))
    return monkeypatch


# ------------------------------------------------------------------------------ configure(...)
class TestConfigureArchList:
    @pytest.mark.parametrize(
        "value,archs",
        [
            ("9.0a", ("90a",)),
            ("9.0", ("90a",)),
            ("9.0a,12.0", ("90a", "120")),
            ("9.0a 12.0", ("90a", "120")),
            (" sm_100a , 9.0a ", ("100a", "90a")),
            (["9.0a", "sm_120"], ("90a", "120")),
            (("10.0",), ("100a",)),
            (["9.0a", "9.0"], ("90a",)),
            ("8.0 9.0a", ("80", "90a")),
            ("8.6,8.9,8.7", ("86", "89", "87")),
            ("sm_80", ("80",)),
        ],
    )
    def test_accepts_a_string_or_a_list(self, jit_env, value, archs):
        assert env.configure(arch_list=value).arch_list == archs
        assert env.target_archs() == env.sort_archs(archs)  # oldest first

    def test_none_means_the_visible_gpus(self, jit_env, monkeypatch):
        monkeypatch.setattr(env, "visible_gpu_archs", lambda: ("120",))
        assert env.configure(arch_list=None).arch_list is None
        assert env.target_archs() == ("120",)

    @pytest.mark.parametrize(
        "value,exc,why",
        [
            ("hopper", SettingsError, "got 'hopper'"),
            ("7.5", SettingsError, "sm_75 is older than sm_80"),
            ("8.0a", SettingsError, "sm_80a does not exist"),
            ("99.9", SettingsError, "sm_999 is not a CUDA arch"),
            ("9.0f", SettingsError, "sm_90f does not exist"),
            ("9.0a,hopper", SettingsError, "'hopper' is not a CUDA arch"),
            ("", SettingsError, "at least one CUDA arch"),
            ([], SettingsError, "at least one CUDA arch"),
            ([90], SettingsTypeError, "got 90 (int)"),
            (9.0, SettingsTypeError, "got 9.0 (float)"),
            ({"9.0a"}, SettingsTypeError, "(set)"),
        ],
    )
    def test_rejects(self, jit_env, value, exc, why):
        with pytest.raises(exc) as ei:
            env.configure(arch_list=value)
        msg = str(ei.value)
        assert msg.startswith("arch_list: expected ") and why in msg, msg
        assert ei.value.name == "arch_list"
        assert env.settings().arch_list == ("90a",)  # unchanged


class TestConfigureKeywords:
    def test_every_keyword(self, jit_env, tmp_path, monkeypatch):
        monkeypatch.setenv("HOME", str(tmp_path))
        s = env.configure(
            cache_root="~/c", disable_jit=True, max_jobs=3, aot_dirs=[tmp_path / "a", str(tmp_path / "b")]
        )
        assert s.cache_root == tmp_path / "c" and s.disable_jit is True and s.max_jobs == 3
        assert s.aot_dirs == (tmp_path / "a", tmp_path / "b")
        assert env.configure(aot_dirs=str(tmp_path)).aot_dirs == (tmp_path,)  # one path
        assert env.configure(aot_dirs=None).aot_dirs == () == env.configure(aot_dirs=()).aot_dirs
        assert env.configure(disable_jit=False).disable_jit is False
        assert env.settings() == s.__class__(tmp_path / "c", ("90a",), False, 3, ())

    @pytest.mark.parametrize(
        "kw,value,exc,message",
        [
            ("disable_jit", "no", SettingsTypeError, "disable_jit: expected True or False, got 'no' (str)"),
            ("disable_jit", 0, SettingsTypeError, "disable_jit: expected True or False, got 0 (int)"),
            ("disable_jit", None, SettingsTypeError, "disable_jit: expected True or False, got None (NoneType)"),
            ("max_jobs", 0, SettingsError, "max_jobs: expected an int >= 1, got 0"),
            ("max_jobs", -2, SettingsError, "max_jobs: expected an int >= 1, got -2"),
            ("max_jobs", "4", SettingsTypeError, "max_jobs: expected an int >= 1, got '4' (str)"),
            ("max_jobs", 2.0, SettingsTypeError, "max_jobs: expected an int >= 1, got 2.0 (float)"),
            ("max_jobs", True, SettingsTypeError, "max_jobs: expected an int >= 1, got True (bool)"),
            ("cache_root", 42, SettingsTypeError, "cache_root: expected a path (str or os.PathLike), got 42 (int)"),
            ("cache_root", "", SettingsError, "cache_root: expected a non-empty path, got ''"),
            ("aot_dirs", 42, SettingsTypeError, "aot_dirs: expected a path or a list/tuple of paths, got 42 (int)"),
            ("aot_dirs", ["x", 1], SettingsTypeError, "aot_dirs: expected a path (str or os.PathLike), got 1 (int)"),
            ("aot_dirs", [""], SettingsError, "aot_dirs: expected a non-empty path, got ''"),
        ],
    )
    def test_rejects_bad_values(self, jit_env, kw, value, exc, message):
        before = env.settings()
        with pytest.raises(exc) as ei:
            env.configure(**{kw: value})
        assert str(ei.value) == message
        assert ei.value.name == kw
        assert env.settings() == before

    def test_type_errors_are_type_errors_and_value_errors(self):
        assert issubclass(SettingsTypeError, TypeError) and issubclass(SettingsTypeError, ValueError)
        assert issubclass(SettingsError, ValueError)

    def test_unknown_keywords_and_positional_arguments(self, jit_env):
        with pytest.raises(TypeError, match="arch"):
            env.configure(arch="9.0a")
        with pytest.raises(TypeError):
            env.configure("9.0a")
        assert env.settings().arch_list == ("90a",)

    def test_nothing_changes_unless_every_keyword_is_valid(self, jit_env):
        before = env.settings()
        with pytest.raises(SettingsTypeError, match="disable_jit"):
            env.configure(max_jobs=5, arch_list="12.0", disable_jit="no")
        assert env.settings() == before

    def test_overrides_a_bad_variable_but_not_the_others(self, from_env):
        from_env.setenv("REPLAYSSM_MAX_JOBS", "abc")
        with pytest.raises(SettingsError, match="REPLAYSSM_MAX_JOBS: expected a positive integer, got 'abc'"):
            env.configure(disable_jit=True)
        assert env.configure(max_jobs=4).max_jobs == 4

    def test_every_keyword_is_documented(self):
        keywords = list(inspect.signature(env.configure).parameters)
        assert sorted(keywords) == sorted(env.ENV_VARS)
        doc = env.configure.__doc__
        for kw in keywords:
            assert f"``{kw}``" in doc and env.ENV_VARS[kw] in doc, kw
        readme = (REPO / "README.md").read_text()
        table = readme[readme.index("Settings:") :]
        table = table[: table.index("\n\n", table.index("| variable"))]
        for kw, var in env.ENV_VARS.items():
            row = next((ln for ln in table.splitlines() if ln.startswith(f"| `{var}`")), None)
            assert row is not None and f"`{kw}=" in row, (var, kw, table)


# ------------------------------------------------------------------------------ environment variables
class TestEnvironmentVariables:
    @pytest.mark.parametrize(
        "var,value",
        [
            ("REPLAYSSM_DISABLE_JIT", "maybe"),
            ("REPLAYSSM_DISABLE_JIT", "2"),
            ("REPLAYSSM_DISABLE_JIT", "enabled"),
            ("REPLAYSSM_MAX_JOBS", "0"),
            ("REPLAYSSM_MAX_JOBS", "-3"),
            ("REPLAYSSM_MAX_JOBS", "1.5"),
            ("REPLAYSSM_MAX_JOBS", "abc"),
            ("REPLAYSSM_CUDA_ARCH_LIST", "bogus"),
            ("REPLAYSSM_CUDA_ARCH_LIST", "99.9"),
            ("REPLAYSSM_CUDA_ARCH_LIST", "7.5"),
            ("REPLAYSSM_CUDA_ARCH_LIST", ","),
        ],
    )
    def test_bad_values_raise_one_error_naming_the_variable(self, from_env, var, value):
        from_env.setenv(var, value)
        with pytest.raises(SettingsError) as ei:
            env.settings()
        msg = str(ei.value)
        assert ei.value.name == var and msg.startswith(f"{var}: expected "), msg
        assert f"got {value!r}" in msg, msg
        with pytest.raises(SettingsError):  # still failing, not cached half-read
            env.settings()

    def test_empty_means_unset(self, from_env):
        for var in ("REPLAYSSM_CUDA_ARCH_LIST", "REPLAYSSM_DISABLE_JIT", "REPLAYSSM_MAX_JOBS", "REPLAYSSM_AOT_DIR"):
            from_env.setenv(var, " ")
        s = env.settings()
        assert s.arch_list is None and s.disable_jit is False and s.aot_dirs == ()
        assert s.max_jobs == env._default_max_jobs()

    def test_accepted_spellings(self, from_env):
        from_env.setenv("REPLAYSSM_MAX_JOBS", " 4 ")
        from_env.setenv("REPLAYSSM_DISABLE_JIT", "Off")
        from_env.setenv("REPLAYSSM_CUDA_ARCH_LIST", "9.0a,sm_120")
        s = env.settings()
        assert s.max_jobs == 4 and s.disable_jit is False and s.arch_list == ("90a", "120")

    def test_several_bad_variables_in_one_error(self, from_env):
        from_env.setenv("REPLAYSSM_MAX_JOBS", "abc")
        from_env.setenv("REPLAYSSM_DISABLE_JIT", "maybe")
        with pytest.raises(SettingsError) as ei:
            env.settings()
        assert "REPLAYSSM_MAX_JOBS: expected" in str(ei.value) and "REPLAYSSM_DISABLE_JIT: expected" in str(ei.value)
        s, errors = env.settings_and_errors()
        assert sorted(errors) == ["disable_jit", "max_jobs"]
        assert s.disable_jit is False and s.max_jobs == env._default_max_jobs()  # defaults for the report

    def test_missing_aot_dir_is_logged_once_when_searched(self, jit_env, tmp_path, caplog):
        missing, present = tmp_path / "no-such-dir", tmp_path / "aot"
        present.mkdir()
        env.configure(aot_dirs=[missing, present])
        caplog.set_level(logging.WARNING, "replayssm.jit")
        for _ in range(2):
            assert jb.prebuilt_roots(("90a",))[:4] == [missing, missing / "90a", present, present / "90a"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and str(missing) in warnings[0] and "does not exist" in warnings[0], warnings


# ------------------------------------------------------------------------------ archs
class TestArchs:
    def test_a_newer_arch_is_accepted_when_nvcc_lists_it(self, monkeypatch):
        monkeypatch.setattr(env, "find_nvcc", lambda: Path("/fake/nvcc"))
        monkeypatch.setattr(env, "nvcc_archs", lambda nvcc: frozenset({"90", "130"}))
        assert env.check_arch("13.0", "X") == "130"
        monkeypatch.setattr(env, "find_nvcc", lambda: None)
        with pytest.raises(SettingsError, match=r"X: expected .*got '13\.0' \(sm_130 is not a CUDA arch"):
            env.check_arch("13.0", "X")

    def test_nvcc_archs_from_list_gpu_code(self, tmp_path):
        nvcc = fake_toolchain(tmp_path / "cuda") / "bin" / "nvcc"
        assert env.nvcc_archs(str(nvcc)) == {"90", "100", "120"}
        broken = tmp_path / "broken-nvcc"
        broken.write_text("#!/bin/sh\nexit 1\n")
        broken.chmod(0o755)
        assert env.nvcc_archs(str(broken)) is None
        assert env.nvcc_archs(str(tmp_path / "absent")) is None

    def test_an_arch_nvcc_cannot_build_fails_before_anything_is_created(self, tmp_path):
        cuda = fake_toolchain(tmp_path / "cuda")  # builds sm_90, sm_100, sm_120
        nvcc = cuda / "bin" / "nvcc"
        with pytest.raises(ToolchainError, match=r"cannot build sm_103a; it builds sm_90, sm_100, sm_120"):
            jb.check_nvcc_archs(nvcc, "nvcc test", ("90a", "103a"))
        jb.check_nvcc_archs(nvcc, "nvcc test", ("90a", "100f", "120a"))
        out = tmp_path / "aot"
        r = subprocess.run(
            [
                PYTHON,
                "-m",
                "replayssm.aot",
                "--arch",
                "10.3a",
                "--out",
                str(out),
                "--only",
                "mamba2_conventional_decode_P64_N128_T1_f32_bf16",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=subprocess_env(CUDA_HOME=cuda),
        )
        assert r.returncode == 1 and "cannot build sm_103a" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()


# ------------------------------------------------------------------------------ python -m replayssm info
def _info(monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setattr(cli, "driver_info", lambda: "not found (test)")
    monkeypatch.setattr(cli, "torch_info", lambda: ("2.13.0+cpu (CUDA build: none)", []))
    monkeypatch.setattr(env, "visible_gpu_archs", lambda: ())
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(["info"])
    return rc, out.getvalue(), err.getvalue()


class TestInfoWithBadSettings:
    @pytest.mark.parametrize(
        "var,value,row",
        [
            ("REPLAYSSM_CUDA_ARCH_LIST", "bogus", "target archs"),
            ("REPLAYSSM_CUDA_ARCH_LIST", "99.9", "target archs"),
            ("REPLAYSSM_MAX_JOBS", "abc", "max jobs"),
            ("REPLAYSSM_MAX_JOBS", "0", "max jobs"),
            ("REPLAYSSM_DISABLE_JIT", "maybe", "JIT"),
        ],
    )
    def test_marks_the_row_and_fails(self, from_env, var, value, row):
        from_env.setenv(var, value)
        rc, out, err = _info(from_env)
        assert rc == 2
        assert re.search(rf"^{re.escape(row)}\s+invalid: {var}: expected .*got {re.escape(repr(value))}", out, re.M), (
            out
        )
        assert err.startswith(f"error: {var}: expected ") and err.count("\n") == 1, err
        for key in ("replayssm", "nvcc", "cache root", "cache content"):  # the rest is still reported
            assert re.search(rf"^{re.escape(key)}\s", out, re.M), (key, out)

    def test_missing_aot_dir_gets_a_warning(self, from_env, tmp_path):
        missing, present = tmp_path / "gone", tmp_path / "aot"
        present.mkdir()
        from_env.setenv("REPLAYSSM_AOT_DIR", f"{missing}{os.pathsep}{present}")
        rc, out, err = _info(from_env)
        assert rc == 0 and not err
        assert re.search(rf"^AOT dirs\s+{re.escape(str(missing))}  WARNING: does not exist", out, re.M), out
        assert re.search(rf"^\s+{re.escape(str(present))}$", out, re.M), out

    def test_no_traceback_from_the_command_line(self, tmp_path):
        e = dict(REPLAYSSM_CACHE_DIR=tmp_path, REPLAYSSM_MAX_JOBS="abc", REPLAYSSM_CUDA_ARCH_LIST="bogus")
        r = subprocess.run(
            [PYTHON, "-m", "replayssm", "info"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=subprocess_env(**e),
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        # Our lines only (a library imported on the way, e.g. torch, may warn on stderr too).
        ours = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert [line.split(":")[1].strip() for line in ours] == ["REPLAYSSM_CUDA_ARCH_LIST", "REPLAYSSM_MAX_JOBS"], ours
        assert re.search(r"^max jobs\s+invalid: REPLAYSSM_MAX_JOBS", r.stdout, re.M), r.stdout
        r = subprocess.run(
            [PYTHON, "-m", "replayssm", "cache", "list"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=subprocess_env(**e),
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.startswith("error: "), r.stderr
        assert "REPLAYSSM_MAX_JOBS: expected" in r.stderr and "REPLAYSSM_CUDA_ARCH_LIST: expected" in r.stderr
