"""Builds for several GPUs (issue 19, items 1 and 4; docs/gpus.md): the '+PTX' arch option and
multi-arch AOT sets, and which prebuilt module the runtime serves on a GPU of a given arch.

* '8.0+PTX' (REPLAYSSM_CUDA_ARCH_LIST, configure(arch_list=...), ``--arch``) embeds compute_80 PTX
  beside the sm_80 cubin; it is part of the flags, the source hash and the folder name, and a bad
  spelling is refused naming the setting.
* ``python -m replayssm.aot --arch "8.0+PTX 9.0a"`` builds one fat module per specialization under
  ``DIR/80+ptx_90a/``; a second set ``DIR/86/`` stands for a per-arch build. With no arch list
  set, a GPU (simulated by replacing ``env.visible_gpu_archs``, as the other tests do) gets the
  module with its own arch's cubin, else an older minor's cubin of its major, else PTX of a lower
  arch; with an arch list set, only a module built for exactly that list.

The real modules (one cheap specialization, three archs) need nvcc and ninja; the rest does not.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from replayssm import aot
from replayssm.jit import MissingModuleError, SettingsError, env
from replayssm.jit import builder as jb

from ..fatbin import fatbin_entries
from .conftest import jit_settings, needs_nvcc

NAME = "mamba2_conventional_decode_P64_N128_T1_f32_bf16"  # one of the cheapest modules of the AOT set
FAT, PER_ARCH = "80+ptx_90a", "86"


def _spec():
    (spec,) = aot.specializations("aot", [NAME])
    return spec


# ------------------------------------------------------------------------------ '+PTX' spellings
class TestPtxArchSpelling:
    @pytest.mark.parametrize(
        "text, arch",
        [("8.0+PTX", "80+ptx"), ("sm_80+ptx", "80+ptx"), ("8.6+Ptx", "86+ptx"), ("12.0+PTX", "120+ptx")],
    )
    def test_normalized(self, text, arch):
        assert env.check_arch(text, "X") == arch
        assert env.arch_label(arch) == f"sm_{arch.removesuffix('+ptx')}+PTX"

    def test_configure_and_environment_and_aot_flag(self, jit_env, monkeypatch):
        assert env.configure(arch_list="8.0+PTX 9.0a").arch_list == ("80+ptx", "90a")
        assert env.configure(arch_list=["8.0", "8.0+PTX"]).arch_list == ("80+ptx",)  # one arch, with PTX
        monkeypatch.setenv("REPLAYSSM_CUDA_ARCH_LIST", "10.0a, 8.0+PTX")
        s, errors = env.read_environment()
        assert not errors and s.arch_list == ("100a", "80+ptx")
        assert aot.resolve_archs(["8.0+PTX 8.9", "9.0a,10.0a"]) == ("80+ptx", "89", "90a", "100a")
        assert env.arch_tag(("100a", "90a", "80+ptx", "89")) == "80+ptx_89_90a_100a"  # oldest first

    @pytest.mark.parametrize(
        "text, why",
        [
            ("9.0+PTX", "sm_90a+PTX: the PTX of an 'a' arch runs on that arch only"),
            ("9.0a+PTX", "sm_90a+PTX: the PTX of an 'a' arch runs on that arch only"),
            ("10.0f+PTX", "sm_100f+PTX: the PTX of an 'f' arch runs on that family only"),
            ("7.5+PTX", "sm_75 is older than sm_80"),
            ("8.0a+PTX", "sm_80a does not exist"),
        ],
    )
    def test_refused_naming_the_setting(self, jit_env, monkeypatch, text, why):
        with pytest.raises(SettingsError) as ei:
            env.configure(arch_list=text)
        assert (
            ei.value.name == "arch_list" and str(ei.value).startswith("arch_list: expected ") and why in str(ei.value)
        )
        assert env.settings().arch_list == ("90a",)  # unchanged
        monkeypatch.setenv("REPLAYSSM_CUDA_ARCH_LIST", text)
        _, errors = env.read_environment()
        assert str(errors["arch_list"]).startswith("REPLAYSSM_CUDA_ARCH_LIST: expected ") and why in str(
            errors["arch_list"]
        )
        with pytest.raises(SettingsError, match="^--arch: expected ") as ei:
            aot.resolve_archs([text])
        assert why in str(ei.value)

    def test_refused_by_the_aot_command(self, capsys, tmp_path):
        assert aot.main(["--arch", "9.0+PTX", "--out", str(tmp_path / "o"), "--only", NAME]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --arch: expected ") and "+PTX on an arch without suffix" in err
        assert not (tmp_path / "o").exists()

    def test_flags_hash_and_folder(self, jit_env):
        spec = _spec()
        ptx, cubin = jb.plan(spec, ("80+ptx",)), jb.plan(spec, ("80",))
        assert [f for f in ptx.flags if f.startswith("-gencode")] == [
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_80,code=compute_80",
        ]
        assert [f for f in cubin.flags if f.startswith("-gencode")] == ["-gencode=arch=compute_80,code=sm_80"]
        assert ptx.src_hash != cubin.src_hash
        assert env.cache_dir(("80+ptx",)) != env.cache_dir(("80",))
        assert env.cache_dir(("80+ptx",)).name == "80+ptx"


# ------------------------------------------------------------------------------ which code a GPU runs
class TestCodeMatch:
    @pytest.mark.parametrize(
        "arch, gpu, match",
        [
            ("90a", "90a", (0, 0)),
            ("86", "86", (0, 0)),
            ("80", "86", (1, 6)),  # an older minor's cubin of the same major
            ("86", "89", (1, 3)),
            ("89", "86", None),  # never a newer minor
            ("80", "90a", None),  # never another major's cubin
            ("100a", "103a", None),  # never an 'a' cubin on another arch
            ("100f", "103a", (1, 3)),  # an 'f' cubin runs on its family
            ("80+ptx", "90a", (2, 10)),  # PTX of a lower arch
            ("80+ptx", "120", (2, 40)),
            ("80+ptx", "86", (1, 6)),  # its cubin first
            ("120+ptx", "90a", None),  # never a higher arch's PTX
        ],
    )
    def test_code_match(self, arch, gpu, match):
        assert env.code_match(arch, gpu) == match

    def test_a_module_must_serve_every_gpu(self):
        assert env.serving_score(("80+ptx", "90a"), ("86", "90a")) == (1, 6)
        assert env.serving_score(("86",), ("86", "90a")) is None
        assert env.serving_score(("86", "89"), ("89",)) == (0, 0)


# ------------------------------------------------------------------------------ real modules
@pytest.fixture(scope="module")
def aot_dir(tmp_path_factory):
    """DIR/80+ptx_90a/ (built by the aot command) and DIR/86/ of the one specialization NAME."""
    if not (env.find_nvcc() and env.find_ninja()):
        pytest.skip("needs nvcc (CUDA toolkit) and ninja")
    out = tmp_path_factory.mktemp("multi_arch") / "aot"
    with jit_settings(cache_root=out.parent / "cache", max_jobs=2):
        assert aot.main(["--arch", "9.0a 8.0+PTX", "--out", str(out), "--only", NAME, "--jobs", "2"]) == 0
        aot.build_set([_spec()], ("86",), out, jobs=2, progress=None)
    return out


@pytest.fixture
def gpus(jit_env, monkeypatch):
    """``gpus('89')``: the runtime sees GPUs of those archs and has no arch list (JIT disabled)."""

    def see(*archs):
        monkeypatch.setattr(env, "visible_gpu_archs", lambda: archs)
        env.configure(arch_list=None, disable_jit=True)

    return see


@needs_nvcc
def test_the_aot_set_carries_each_arch(aot_dir):
    assert sorted(p.name for p in aot_dir.iterdir()) == sorted([FAT, PER_ARCH])
    fat = aot_dir / FAT / NAME
    assert json.loads((fat / "meta.json").read_text())["archs"] == ["80+ptx", "90a"]
    assert fatbin_entries(fat / f"{NAME}.so") == {("cubin", 80), ("ptx", 80), ("cubin", 90)}
    assert fatbin_entries(aot_dir / PER_ARCH / NAME / f"{NAME}.so") == {("cubin", 86)}


@needs_nvcc
@pytest.mark.parametrize(
    "visible, folder",
    [
        (("90a",), FAT),  # its own sm_90a cubin
        (("80",), FAT),  # its own sm_80 cubin
        (("86",), PER_ARCH),  # its own
        (("89",), PER_ARCH),  # sm_86 is a closer older minor than sm_80
        (("87",), PER_ARCH),
        (("100a",), FAT),  # compute_80 PTX
        (("120",), FAT),
        (("86", "90a"), FAT),  # the only module that serves both
    ],
    ids=lambda v: "+".join(v) if isinstance(v, tuple) else v,
)
def test_the_runtime_picks_the_module_the_gpu_runs_best(aot_dir, gpus, visible, folder):
    gpus(*visible)
    env.configure(aot_dirs=[aot_dir])
    assert jb.build(_spec()) == aot_dir / folder / NAME
    env.configure(aot_dirs=[aot_dir / folder])  # a DIR/<archs> folder named directly
    assert jb.build(_spec()) == aot_dir / folder / NAME


@needs_nvcc
def test_packaged_modules_are_found_the_same_way(aot_dir, gpus, monkeypatch):
    monkeypatch.setattr(jb, "packaged_aot_root", lambda: aot_dir)
    gpus("89")
    assert jb.build(_spec()) == aot_dir / PER_ARCH / NAME
    gpus("90a")
    assert jb.build(_spec()) == aot_dir / FAT / NAME


@needs_nvcc
def test_no_module_a_gpu_can_run(aot_dir, gpus):
    gpus("90a")
    env.configure(aot_dirs=[aot_dir / PER_ARCH])  # sm_86 code only
    with pytest.raises(MissingModuleError) as ei:
        jb.build(_spec())
    assert str(aot_dir / PER_ARCH) in ei.value.searched


@needs_nvcc
def test_an_arch_list_takes_only_modules_built_for_exactly_it(aot_dir, jit_env):
    env.configure(aot_dirs=[aot_dir], disable_jit=True, arch_list="9.0a")
    with pytest.raises(MissingModuleError):  # DIR/80+ptx_90a has sm_90a code, but was not asked for
        jb.build(_spec())
    env.configure(arch_list="9.0a 8.0+PTX")
    assert jb.build(_spec()) == aot_dir / FAT / NAME


@needs_nvcc
def test_a_stale_module_gives_way_to_the_next_best(aot_dir, gpus, tmp_path):
    copy = tmp_path / "aot"
    shutil.copytree(aot_dir, copy)
    meta_path = copy / PER_ARCH / NAME / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["source_hash"] = "f" * 64  # built from other sources
    meta_path.write_text(json.dumps(meta))
    gpus("89")
    env.configure(aot_dirs=[copy])
    assert jb.build(_spec()) == copy / FAT / NAME  # the sm_80 cubin


@needs_nvcc
def test_the_gpus_own_cached_module_beats_a_ptx_module(aot_dir, gpus, caplog):
    """On a GPU of sm_100a the AOT set has only PTX: served (and logged) until the cache holds a
    module built for sm_100a, which then wins; an AOT module with the GPU's own cubin beats both."""
    gpus("100a")
    env.configure(aot_dirs=[aot_dir])
    caplog.set_level(logging.INFO, "replayssm.jit")
    assert jb.build(_spec()) == aot_dir / FAT / NAME
    assert any("the driver JIT-compiles its PTX" in r.getMessage() for r in caplog.records)
    # A current cache entry for sm_100a (its files copied; only meta.json is read to serve it).
    bp = jb.plan(_spec())
    assert bp.archs == ("100a",)
    cached = env.cache_dir(bp.archs) / NAME
    shutil.copytree(aot_dir / PER_ARCH / NAME, cached)
    compiler = env.nvcc_version(str(env.find_nvcc()))
    meta = json.loads((cached / "meta.json").read_text())
    meta.update(archs=["100a"], source_hash=bp.src_hash, fingerprint=bp.fingerprint(compiler))
    (cached / "meta.json").write_text(json.dumps(meta))
    assert jb.build(_spec()) == cached
    gpus("90a")  # the same cache layout for sm_90a: the AOT cubin for sm_90a comes first
    bp = jb.plan(_spec())
    shutil.copytree(cached, env.cache_dir(bp.archs) / NAME)
    meta.update(archs=["90a"], source_hash=bp.src_hash, fingerprint=bp.fingerprint(compiler))
    (env.cache_dir(bp.archs) / NAME / "meta.json").write_text(json.dumps(meta))
    assert jb.build(_spec()) == aot_dir / FAT / NAME
