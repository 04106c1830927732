"""docs/hooks.md's remote-sandbox recipes as `make test-recipes` reads them
(tests/recipes/page.py), checked without PyPI nor network: each provider's subsection has
its creation block and its hook-and-lease block, names the version it was checked against,
and its DELETE and LEASE programs parse; so that an edit of the page that the recipes'
check could no longer read, or a recipe that cannot even run, fails `make test` at once."""

from __future__ import annotations

import ast
import subprocess

import pytest
from recipes.page import PROVIDERS, blocks, pinned


def programs(block: str) -> dict[str, str]:
    """The string constants the block assigns to DELETE and LEASE."""
    found = {}
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DELETE", "LEASE"):
                    found[target.id] = node.value.value
    return found


def registrations(block: str) -> dict[str, ast.Call]:
    """The block's calls of exitwatch.on_death and exitwatch.while_alive, by name."""
    return {
        node.func.attr: node
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("on_death", "while_alive")
    }


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_each_provider_has_a_creation_block_and_a_hook_and_lease_block(name: str) -> None:
    provider = PROVIDERS[name]
    create, hooks = blocks(provider.heading)
    ast.parse(create)
    assert sorted(programs(hooks)) == ["DELETE", "LEASE"]
    for program in programs(hooks).values():
        compile(program, f"{name}'s recipe", "exec")
    calls = registrations(hooks)
    assert sorted(calls) == ["on_death", "while_alive"]
    for call in calls.values():
        keywords = {k.arg for k in call.keywords}
        assert "env" in keywords and "timeout" in keywords
        # The key travels in env=, never in argv: no environment lookup in the argv.
        assert "environ" not in ast.unparse(call.args[0])
    assert "every" in {k.arg for k in calls["while_alive"].keywords}


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_each_provider_names_the_version_it_was_checked_against(name: str) -> None:
    pins = pinned(PROVIDERS[name])
    assert [p.split("==")[0] for p in pins] == list(PROVIDERS[name].packages)
    assert all(p.split("==")[1][0].isdigit() for p in pins)


def test_the_plain_http_recipe_is_sh_that_parses() -> None:
    [hooks] = blocks("Plain HTTP")
    assert sorted(registrations(hooks)) == ["on_death", "while_alive"]
    for name, program in programs(hooks).items():
        parsed = subprocess.run(["sh", "-n", "-c", program], capture_output=True, text=True)
        assert parsed.returncode == 0, (name, parsed.stderr)
        assert "-H @-" in program  # the token on curl's stdin, not in its argv
