"""What `sam build` puts in the Lambda layer: what the nine functions import, no CLI, no SDK skew.

`sam build` itself cannot run here: it needs python3.12 on PATH or Docker, and this machine has
neither. So these tests read what it would build from template.yaml. `GpujobsLayer` has
`ContentUri: layers/gpujobs/` and `BuildMethod: python3.12`: SAM copies that folder (less bytecode
caches) into the layer and pip-installs its requirements.txt beside it. The files under ContentUri
are therefore the layer's own code, and requirements.txt names everything else in it.
`.ci/check-template` resolves that file to the real python3.12/arm64 wheels (it needs PyPI).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gpujobs_local.template import load_template, resource, resources_of_type

ROOT = Path(__file__).resolve().parents[2]
CLI_AND_LOCAL = ("gpujobs_cli", "gpujobs_local")


def layer_folder() -> Path:
    return ROOT / resource("GpujobsLayer")["Properties"]["ContentUri"]


def layer_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every Python file SAM copies from ContentUri."""
    folder = layer_folder()
    modules = {}
    for path in folder.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(folder).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def handler_files() -> dict[str, Path]:
    """Function logical id -> the file its Handler names."""
    handlers = {}
    for logical_id, function in resources_of_type("AWS::Serverless::Function").items():
        props = function["Properties"]
        module, _attribute = props["Handler"].rsplit(".", 1)
        handlers[logical_id] = ROOT / props["CodeUri"] / f"{module.replace('.', '/')}.py"
    return handlers


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for each import a file may run; lazy ones included.

    Imports under `if TYPE_CHECKING:` never run (typing stubs are dev-only) and are left out.
    `import a.b` is ("a.b", []); `from a import b, c` is ("a", ["b", "c"]), where b may be a module.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            assert node.module is not None
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def loaded_by_functions() -> tuple[set[str], set[str], set[str]]:
    """What the nine functions load, following gpujobs's own imports from their handlers.

    Returns (gpujobs modules found in the layer, gpujobs modules imported but not in it, the other
    top-level packages imported).
    """
    modules = layer_modules()
    found: set[str] = set()
    missing: set[str] = set()
    others: set[str] = set()
    todo = [imported for path in handler_files().values() for imported in runtime_imports(path)]
    while todo:
        module, names = todo.pop()
        if module.split(".")[0] != "gpujobs":
            others.add(module.split(".")[0])
            continue
        if module not in modules:
            missing.add(module)
            continue
        parts = module.split(".")
        for loaded in [".".join(parts[:i]) for i in range(1, len(parts) + 1)] + [
            f"{module}.{name}" for name in names if f"{module}.{name}" in modules
        ]:
            if loaded not in found:  # importing a.b.c runs a and a.b first
                found.add(loaded)
                todo.extend(runtime_imports(modules[loaded]))
    return found, missing, others


def requirements() -> list[Requirement]:
    lines = (layer_folder() / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [Requirement(line) for line in (line.split("#")[0].strip() for line in lines) if line]


def installed_closure(roots: list[Requirement]) -> set[str]:
    """Every distribution pip installs for these requirements, by name, read from this install's metadata."""
    shipped: set[str] = set()
    todo = [(root.name, frozenset(root.extras)) for root in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        shipped.add(canonicalize_name(name))
        for line in metadata.requires(name) or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras | {""}):
                todo.append((needed.name, frozenset(needed.extras)))
    return shipped


# ---- the layer's code -------------------------------------------------------------------------------
def test_every_function_runs_on_the_layer_sam_builds_with_pip() -> None:
    layer = resource("GpujobsLayer")

    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    # built by layers/gpujobs/Makefile: pip installs requirements.txt as SAM's python3.12 builder did,
    # then the bytecode is compiled (tests/integration/test_sam_build.py checks what it built)
    assert layer["Metadata"]["BuildMethod"] == "makefile"
    assert layer["Metadata"]["BuildArchitecture"] == "arm64"
    assert (layer_folder() / "requirements.txt").is_file()
    build = (layer_folder() / "Makefile").read_text(encoding="utf-8")
    assert "build-GpujobsLayer:" in build
    assert '--requirement "$(HERE)requirements.txt"' in build
    assert "--python-version 3.12" in build
    assert load_template()["Globals"]["Function"]["Layers"] == [{"Ref": "GpujobsLayer"}]
    assert len(handler_files()) == 9
    assert all(path.is_file() for path in handler_files().values()), handler_files()


def test_the_layer_holds_no_cli_code() -> None:
    modules = layer_modules()
    cli_spec = importlib.util.find_spec("gpujobs_cli")

    assert not [name for name in modules if name.split(".")[0] in CLI_AND_LOCAL or "cli" in name.split(".")]
    assert cli_spec is not None
    assert cli_spec.origin is not None
    assert not Path(cli_spec.origin).resolve().is_relative_to(layer_folder().resolve())
    importers = {
        name
        for name, path in modules.items()
        if any(module.split(".")[0] in CLI_AND_LOCAL for module, _names in runtime_imports(path))
    }
    assert importers == set(), "the layer imports the CLI or the local cloud"


def test_every_gpujobs_module_the_functions_import_is_in_the_layer() -> None:
    found, missing, _ = loaded_by_functions()

    assert {"gpujobs.runtime.bootstrap", "gpujobs.runtime.observability", "gpujobs.domain.states"} <= found
    assert missing == set(), "a function imports gpujobs code that the layer does not ship"


def test_every_other_package_the_functions_import_comes_from_the_layers_requirements() -> None:
    _, _, others = loaded_by_functions()
    providers = metadata.packages_distributions()
    shipped = installed_closure(requirements())

    missing = {
        top
        for top in others - set(sys.stdlib_module_names)
        if not {canonicalize_name(dist) for dist in providers.get(top, [])} & shipped
    }

    assert {"aws_lambda_powertools", "pydantic", "boto3"} <= others
    assert missing == set(), "imported by a function but neither in the runtime's stdlib nor in requirements.txt"


# ---- no SDK skew ------------------------------------------------------------------------------------
def sdk_skew(roots: list[Requirement]) -> str | None:
    """Why these requirements would ship a boto3/botocore pair never released together; None if they do not."""
    shipped = {"boto3", "botocore"} & installed_closure(roots)
    if not shipped:
        return None
    if shipped != {"boto3", "botocore"}:
        return f"ships {' and '.join(sorted(shipped))} alone; the runtime's copy of the other would run with it"
    pins = {canonicalize_name(r.name): r.specifier for r in roots}
    exact = {name: [s.version for s in pins.get(name, []) if s.operator == "=="] for name in ("boto3", "botocore")}
    if not (exact["boto3"] and exact["botocore"]):
        return f"boto3 and botocore must both be pinned with ==, got {exact}"
    if exact["boto3"] != exact["botocore"]:  # boto3 1.x.y is released with botocore 1.x.y
        return f"boto3 {exact['boto3'][0]} with botocore {exact['botocore'][0]}"
    return None


def test_the_layer_ships_boto3_and_botocore_of_one_release() -> None:
    assert sdk_skew(requirements()) is None


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (["aws-lambda-powertools[tracer]==3.37.0"], "ships botocore alone"),
        (["boto3==1.44.8"], "must both be pinned"),
        (["boto3==1.44.8", "botocore==1.44.7"], "boto3 1.44.8 with botocore 1.44.7"),
    ],
    ids=["xray-sdk-brings-botocore-alone", "boto3-without-its-botocore", "two-releases"],
)
def test_a_skewed_pair_is_caught(lines: list[str], problem: str) -> None:
    found = sdk_skew([Requirement(line) for line in lines])

    assert found is not None
    assert problem in found


def test_a_layer_without_the_sdk_has_no_skew() -> None:
    assert sdk_skew([Requirement("pydantic>=2.11,<3"), Requirement("aws-lambda-powertools[parser]==3.37.0")]) is None
