"""The engine's settings are declared and checked once (EngineSettings), and every
application takes them under the same flags."""

from __future__ import annotations

import argparse
import dataclasses
import os

import pytest

from data_pipelines.harvest import HarvestConfig
from gambit_core.cli import add_dataclass_args
from gambit_core.errors import InputError
from gambit_search.bench import BenchConfig
from gambit_search.engines import EngineSettings
from gambit_search.serve.cli import ServeConfig
from gambit_search.solve.config import SolveConfig, setting_names

APPS = {SolveConfig: {}, ServeConfig: {}, BenchConfig: {"out": "x"}, HarvestConfig: {"out": "x"}}


@pytest.mark.parametrize("cls", list(APPS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad, msg", [({"max_live": 0}, "--max-live must be >= 1, got 0"),
                                      ({"kv_cache": 0.0}, "--kv-cache must be > 0 GiB"),
                                      ({"engine": "tpu"}, "--engine must be one of fake, vllm"),
                                      ({"dtype": "fp8"}, "--dtype must be one of auto, float32"),
                                      ({"engine": "fake", "dtype": "bfloat16"},
                                       "--engine fake runs --dtype auto or float32 only")])
def test_every_app_config_is_checked_by_engine_settings(cls, bad, msg):
    assert issubclass(cls, EngineSettings)
    with pytest.raises(InputError, match=msg):
        cls(**APPS[cls], **bad)


@pytest.mark.parametrize("cls", list(APPS), ids=lambda c: c.__name__)
def test_engine_flags_are_spelled_alike_and_asks_are_no_flags(cls):
    p = argparse.ArgumentParser()
    add_dataclass_args(p, cls)
    opts = {o for a in p._actions for o in a.option_strings}
    assert {"--engine", "--model", "--dtype", "--max-live", "--kv-cache"} <= opts
    assert not {"--confidence", "--extra"} & opts
    assert {"confidence", "extra"}.isdisjoint(setting_names(cls))


def test_engine_settings_keep_the_engine_fields_and_take_the_asks():
    cfg = SolveConfig(engine="fake", max_live=8, kv_cache=0.5, seed=3, scorer="run.pt")
    s = cfg.engine_settings(seed=cfg.seed, confidence=True)
    assert type(s) is EngineSettings
    assert (s.engine, s.max_live, s.kv_cache, s.seed, s.confidence) == ("fake", 8, 0.5, 3, True)
    assert s.scorer is None  # the run's scorer is the driver's, not the engine's
    assert not any(f.name in ("confidence", "extra") for f in dataclasses.fields(cfg)
                   if f.metadata.get("fingerprint", True))


@pytest.mark.parametrize("gib, blocks", [(1.0, 1024), (0.25, 256), (0.0001, 1)])
def test_the_fake_engine_honours_kv_cache(gib, blocks):
    """--engine fake --kv-cache sizes the fake pool (it used to be silently 1,024 blocks)."""
    from gambit_search.engines import get_engine_kind

    engine = get_engine_kind("fake").start(EngineSettings(engine="fake", kv_cache=gib, max_live=4))
    assert engine.config.num_blocks == blocks
    assert engine.config.max_num_seqs == 4


def test_dtype_reaches_the_vllm_engine_config(monkeypatch):
    """--dtype is a setting of every app, and the vLLM kind passes it on to its engine."""
    import gambit_search.vllm_engine as ve
    from gambit_search.engines import get_engine_kind

    seen = {}
    monkeypatch.setattr(ve, "VLLMEngine", lambda cfg: seen.setdefault("cfg", cfg))
    get_engine_kind("vllm").start(EngineSettings(dtype="bfloat16", kv_cache=0.5))
    assert (seen["cfg"].dtype, seen["cfg"].kv_cache_memory_bytes) == ("bfloat16", 1 << 29)


@pytest.mark.parametrize("entry", ["data_pipelines.harvest:main", "gambit_search.solve.cli:main",
                                   "gambit_search.serve.cli:main", "gambit_search.bench:main"])
def test_every_engine_app_has_one_verbose_flag(entry, capsys):
    """Each console script that starts an engine is quiet by default and says so in --help."""
    import importlib

    mod, fn = entry.split(":")
    with pytest.raises(SystemExit):
        getattr(importlib.import_module(mod), fn)(["--help"])
    out = capsys.readouterr().out
    assert "-v, --verbose" in out and "show vLLM's" in out


def test_quiet_logs_quiets_unless_verbose_and_a_user_level_wins(monkeypatch):
    from gambit_core.cli import quiet_logs

    for var in ("VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY"):
        monkeypatch.delenv(var, raising=False)
    quiet_logs(verbose=True)
    assert "VLLM_LOGGING_LEVEL" not in os.environ
    quiet_logs(verbose=False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    quiet_logs(verbose=False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
