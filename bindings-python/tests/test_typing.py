"""The public calls are typed: every asyncio call takes the same keyword
arguments as its blocking form, and the native module's stubs match it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import gendurable
from gendurable import _gendurable

PAIRS = ["migrate", "insert", "insert_many", "get", "signal", "cancel", "shutdown"]


@pytest.mark.parametrize("name", PAIRS)
def test_async_calls_take_the_arguments_of_their_blocking_form(name):
    sync = inspect.signature(getattr(gendurable.Engine, name))
    coro = inspect.signature(getattr(gendurable.Engine, f"{name}_async"))
    assert list(coro.parameters.values()) == list(sync.parameters.values())
    assert coro.return_annotation == sync.return_annotation
    assert inspect.iscoroutinefunction(getattr(gendurable.Engine, f"{name}_async"))


def test_no_call_hides_its_options_in_kwargs():
    """Type checkers see every option: no ``**kwargs: Any`` on a public call
    of the engine (the bulkhead's ``call`` only forwards its arguments)."""
    for cls in (gendurable.Engine, gendurable.NewInstance):
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") and name != "__init__":
                continue
            for p in inspect.signature(fn).parameters.values():
                assert p.kind is not p.VAR_KEYWORD, f"{cls.__name__}.{name}(**{p.name})"
                if p.name != "self":
                    assert p.annotation is not p.empty, f"{cls.__name__}.{name}({p.name})"


def test_insert_async_options_are_checked(make_engine):
    engine = make_engine()
    with pytest.raises(TypeError):
        engine.insert_async("W", {}, priorty=1)  # a typo is a TypeError at once


def test_the_stubs_match_the_native_module():
    stub = Path(gendurable.__file__).with_name("_gendurable.pyi")
    tree = ast.parse(stub.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    native_functions = {
        n for n, v in vars(_gendurable).items() if callable(v) and not isinstance(v, type)
    }
    assert functions == native_functions
    core = {
        n.name
        for n in classes["Core"].body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")
    }
    native_core = {n for n in dir(_gendurable.Core) if not n.startswith("__")}
    assert core == native_core
    assert (Path(gendurable.__file__).parent / "py.typed").exists()
