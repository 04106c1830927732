"""The probe of tests/recipes/check.py, run inside a provider's venv (the SDK is there,
not in check.py's interpreter): it prints, as one JSON line, the SDK's versions, the page's
creation block bound to the SDK's signatures, and what the page says the SDK has or lacks;
and it runs the page's hook-and-lease block with this checkout's exitwatch, which writes
into the spools the environment names (EXITWATCH_HOOK_DIR, EXITWATCH_LEASE_DIR)."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run with -I

from page import PROVIDERS, SANDBOX_ID, blocks, this_exitwatch


def _resolve(node: ast.expr, ns: dict) -> object:
    """The callable a call's func names: a name, an attribute chain, or an attribute of an
    instance being made (`Daytona().create`: the class's function, bound to a stand-in)."""
    if isinstance(node, ast.Name):
        return ns[node.id]
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Call):
            cls = _resolve(node.value.func, ns)
            return getattr(cls, node.attr)
        return getattr(_resolve(node.value, ns), node.attr)
    raise LookupError(ast.unparse(node))


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def bind_calls(source: str) -> list[str]:
    """Each call of the creation block bound to its callee's signature, nothing run but
    the block's imports. A keyword the callee does not take is a failure."""
    tree = ast.parse(source)
    ns: dict = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            exec(compile(ast.Module([stmt], []), "<imports>", "exec"), ns)
    done = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = _resolve(node.func, ns)
        args = [None] * len(node.args)
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call):
            args.insert(0, None)  # self
        kwargs = {k.arg: None for k in node.keywords if k.arg}
        signature = inspect.signature(func)
        signature.bind(*args, **kwargs)
        # A keyword a **opts swallows is one the callee may ignore: it must be named.
        if unnamed := [k for k in kwargs if k not in signature.parameters]:
            raise TypeError(f"{ast.unparse(node.func)} has no parameter named {', '.join(unnamed)}")
        said = f"{ast.unparse(node.func)}({', '.join(kwargs)})"
        if hasattr(func, "model_validate") and all(_literal(k.value) for k in node.keywords):
            # A pydantic model of literals is made for real: its validators see the values.
            func(
                *[ast.literal_eval(a) for a in node.args],
                **{k.arg: ast.literal_eval(k.value) for k in node.keywords},
            )
            said += " made"
        done.append(said)
    return done


EXTENDS = re.compile(r"timeout|extend|keep.?alive|renew|lifetime|ttl", re.I)


def binds(cls: type, delete: str, lease: str, *args: object, **kwargs: object) -> tuple[bool, str]:
    """The methods the page's DELETE and LEASE call on the sandbox that a lookup returns
    (the stand-in's 404 ends both at the lookup): the first with no argument, the second
    with the page's."""
    what = f"Sandbox.{delete}() and Sandbox.{lease}(...) take the page's arguments"
    try:
        inspect.signature(getattr(cls, delete)).bind(None)
        inspect.signature(getattr(cls, lease)).bind(None, *args, **kwargs)
    except (AttributeError, TypeError) as err:
        return False, f"{what}: {err}"
    return True, what


def claims(name: str) -> list[tuple[bool, str]]:
    """What the page says each SDK has, or lacks, to renew a sandbox's timer."""
    if name == "daytona":
        from daytona import Sandbox

        have = ("set_ttl", "refresh_activity", "set_autostop_interval")
        return [
            (all(hasattr(Sandbox, m) for m in have), f"Sandbox has {', '.join(have)}"),
            binds(Sandbox, "delete", "set_ttl", 10),
        ]
    if name == "e2b":
        from e2b import Sandbox

        return [(hasattr(Sandbox, "set_timeout"), "Sandbox has set_timeout")]
    if name == "modal":
        import modal
        from modal_proto import api_pb2

        calls = [n for n in dir(modal.Sandbox) if not n.startswith("_") and EXTENDS.search(n)]
        asks = [n for n in dir(api_pb2) if n.startswith("Sandbox") and EXTENDS.search(n)]
        return [
            binds(modal.Sandbox, "terminate", "exec", "true", timeout=30),
            (
                not calls and not asks,
                f"no call renews a sandbox's timeout: {calls + asks or 'none'}",
            ),
        ]
    if name == "prime":
        from prime_sandboxes import SandboxClient

        calls = [n for n in dir(SandboxClient) if not n.startswith("_") and EXTENDS.search(n)]
        helps = subprocess.run(
            [
                os.path.join(os.path.dirname(sys.executable), "prime"),
                "--plain",
                "sandbox",
                "--help",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        ).stdout
        commands = helps[helps.find("Commands") :]
        cli = [w for w in EXTENDS.findall(commands)]
        ok = not calls and not cli and " delete " in commands
        return [
            (ok, f"no SDK call nor CLI command renews a sandbox's timeout: {calls + cli or 'none'}")
        ]
    return []


def main(name: str) -> None:
    """In the provider's venv: its versions, the creation block bound, the hook-and-lease
    block run with this checkout's exitwatch (spools from the environment)."""
    from importlib import metadata

    exitwatch, notes = this_exitwatch()
    provider = PROVIDERS[name]
    report: dict = {"versions": {p: metadata.version(p) for p in provider.packages}}
    create, hooks = blocks(provider.heading)
    report["bound"] = bind_calls(create)
    report["claims"] = claims(name)
    report["notes"] = notes
    ns = {"os": os, "sys": sys, "exitwatch": exitwatch}
    ns["sandbox"] = type(
        "Sandbox", (), {"id": SANDBOX_ID, "sandbox_id": SANDBOX_ID, "object_id": SANDBOX_ID}
    )()
    exec(compile(hooks, f"docs/hooks.md ({provider.heading})", "exec"), ns)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
