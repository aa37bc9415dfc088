"""Parsing the two push envelopes into a CellRequest: every accepted shape, every refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernel_worker.environments import lock_key
from kernel_worker.errors import BadRequest, EnvironmentFailed, status_for
from kernel_worker.protocol.envelopes import (
    CellRequest,
    InjectedSpec,
    InputSpec,
    input_extension,
    parse_execute_v1,
    parse_notebook_execute,
)


def v1(*, params: dict[str, Any] | None = None, inputs: Any = None, **top: Any) -> dict[str, Any]:
    """An executor-v1 envelope; ``params`` are merged over ``source: "x = 1"``."""
    envelope: dict[str, Any] = {
        "protocol_version": "v1",
        "transform": {"ref": "notebook_cell@v1", "params": {"source": "x = 1", **(params or {})}},
        "inputs": [] if inputs is None else inputs,
    }
    envelope.update(top)
    return envelope


def flat(**fields: Any) -> dict[str, Any]:
    envelope: dict[str, Any] = {"protocol_version": "notebook-cell-v1", "source": "x = 1"}
    envelope.update(fields)
    return envelope


def parse_v1(envelope: Any) -> CellRequest:
    return parse_execute_v1(json.dumps(envelope).encode())


def parse_flat(envelope: Any) -> CellRequest:
    return parse_notebook_execute(json.dumps(envelope).encode())


def v1_detail(envelope: Any) -> str:
    with pytest.raises(BadRequest) as info:
        parse_v1(envelope)
    return info.value.detail


def flat_detail(envelope: Any) -> str:
    with pytest.raises(BadRequest) as info:
        parse_flat(envelope)
    return info.value.detail


# ---- what the real client sends ------------------------------------------------------


def test_real_client_envelope_parses() -> None:
    """The shape captured from strata-notebook 0.11 (spec §12.3), extra keys and all."""
    envelope = {
        "protocol_version": "v1",
        "build_id": "notebook-0123456789ab",
        "tenant": None,
        "principal": None,
        "origin": "local",
        "provenance_hash": "abc",
        "transform": {
            "ref": "notebook_cell@v1",
            "code_hash": "def",
            "params": {
                "source": "y = df.a.sum()",
                "timeout_seconds": 12.5,
                "mounts": [],
                "env": {"MODEL": "bge", "N": 3},
                "mutation_defines": ["df"],
                "tables": {"t": {"uri": "strata://table/t", "snapshot_id": None}},
            },
        },
        "inputs": [
            {
                "name": "df",
                "format": "arrow/ipc",
                "uri": None,
                "byte_size": 10,
                "file": "df.arrow",
            },
            {
                "name": "Big",
                "format": "json/object",
                "uri": None,
                "byte_size": 1,
                "file": "Big-f69fd263.json",
            },
            {
                "name": "helper",
                "format": "module/cell",
                "file": "helper.cell_module.json",
                "injected": {
                    "n": {"content_type": "json/object", "file": "helper__inj__n.json"},
                    "m": {"content_type": "pickle/object", "file": "helper__inj__m.pickle"},
                },
            },
        ],
    }
    request = parse_v1(envelope)
    assert request.source == "y = df.a.sum()"
    assert request.timeout_seconds == 12.5
    assert dict(request.env) == {"MODEL": "bge", "N": "3"}
    assert request.mutation_defines == ("df",)
    assert dict(request.tables) == {"t": {"uri": "strata://table/t", "snapshot_id": None}}
    assert request.build_id == "notebook-0123456789ab"
    assert request.language == "python"
    assert request.mounts == ()
    df, big, helper = request.inputs
    assert df == InputSpec("df", "arrow/ipc", "df.arrow", ("df.arrow", "df"), ())
    assert big == InputSpec(
        "Big", "json/object", "Big-f69fd263.json", ("Big-f69fd263.json", "Big", "Big.json"), ()
    )
    assert helper.file == "helper.cell_module.json"
    assert helper.injected == (
        InjectedSpec("n", "json/object", "__inj_3_0.json", ("helper__inj__n.json", "n", "n.json")),
        InjectedSpec(
            "m", "pickle/object", "__inj_3_1.pickle", ("helper__inj__m.pickle", "m", "m.pickle")
        ),
    )


def test_defaults() -> None:
    request = parse_execute_v1(b'{"transform": {"ref": "notebook_cell@v1"}}')
    assert request == CellRequest(
        source="",
        timeout_seconds=30.0,
        inputs=(),
        env={},
        mounts=(),
        mutation_defines=(),
        build_id=None,
        tables={},
        language="python",
    )


def test_seed_descriptor_without_file_uses_name_and_extension() -> None:
    request = parse_v1(v1(inputs=[{"name": "df", "format": "arrow/ipc"}, {"name": "w"}]))
    df, weights = request.inputs
    assert (df.file, df.part_names) == ("df.arrow", ("df", "df.arrow"))
    assert (weights.content_type, weights.file) == ("pickle/object", "w.pickle")


@pytest.mark.parametrize(
    ("content_type", "extension"),
    [
        ("arrow/ipc", ".arrow"),
        ("json/object", ".json"),
        ("pickle/object", ".pickle"),
        ("module/import", ".module.json"),
        ("module/cell", ".cell_module.json"),
        ("module/cell-instance", ".cell_instance.pickle"),
        ("dir/tar", ".dir.tar"),
        ("text/markdown", ".bin"),
        ("file/path", ".bin"),
        ("application/x-r-rds", ".bin"),
        ("image/png", ".bin"),
    ],
)
def test_default_extensions(content_type: str, extension: str) -> None:
    assert input_extension(content_type) == extension


def test_blank_file_means_default_and_name_is_stripped() -> None:
    request = parse_v1(v1(inputs=[{"name": " df ", "format": "json/object", "file": "  "}]))
    assert request.inputs[0].name == "df"
    assert request.inputs[0].file == "df.json"


def test_part_names_are_deduplicated_in_order() -> None:
    request = parse_v1(v1(inputs=[{"name": "x", "format": "json/object", "file": "x.json"}]))
    assert request.inputs[0].part_names == ("x.json", "x")


def test_numeric_string_timeout_is_accepted_like_the_reference() -> None:
    assert parse_v1(v1(params={"timeout_seconds": "2.5"})).timeout_seconds == 2.5
    assert parse_v1(v1(params={"timeout_seconds": " 7 "})).timeout_seconds == 7.0
    assert parse_v1(v1(params={"timeout_seconds": None})).timeout_seconds == 30.0
    assert parse_v1(v1(params={"timeout_seconds": 1e-9})).timeout_seconds == 1e-9


def test_null_is_a_field_left_out() -> None:
    """The rule's first half, field by field: ``null`` gets the field's default."""
    request = parse_v1(
        {
            "protocol_version": None,
            "transform": {
                "ref": "notebook_cell@v1",
                "params": {
                    "source": None, "timeout_seconds": None, "env": None, "mounts": None,
                    "mutation_defines": None, "tables": None, "language": None,
                    "environment": None,
                },
            },
            "inputs": None,
            "build_id": None,
        }
    )  # fmt: skip
    assert request == parse_execute_v1(b'{"transform": {"ref": "notebook_cell@v1"}}')
    assert parse_v1({"transform": {"ref": "notebook_cell@v1", "params": None}}) == request
    described = parse_v1(v1(inputs=[{"name": "x", "format": None, "file": None, "injected": None}]))
    assert described.inputs[0].content_type == "pickle/object"
    assert described.inputs[0].file == "x.pickle"
    flat_one = parse_flat(flat(source=None, inputs={"x": {"content_type": None}}))
    assert flat_one.source == "" and flat_one.inputs[0].content_type == "pickle/object"
    assert parse_flat(flat(inputs=None)).inputs == ()
    (mount,) = parse_v1(
        v1(params={"mounts": [{"name": "d", "uri": "s3://b/p", "mode": None}]})
    ).mounts
    assert mount.mode == "ro"


def test_fields_the_worker_does_not_read_are_ignored() -> None:
    """As by the reference: the client sends several, and a newer one may add more."""
    plain = parse_v1(v1())
    assert parse_v1(v1(outputs=5, tenant=None, principal=None, origin="notebook")) == plain
    assert parse_v1(v1(params={"outputs": 5, "input_specs": []})) == plain


def test_build_id_blank_is_none() -> None:
    assert parse_v1(v1(build_id="")).build_id is None


def test_language_python_explicit() -> None:
    assert parse_v1(v1(params={"language": "python"})).language == "python"


def test_request_is_immutable() -> None:
    request = parse_v1(v1(params={"env": {"A": "1"}}))
    with pytest.raises(TypeError):
        request.env["B"] = "2"  # type: ignore[index]


def test_flat_envelope() -> None:
    request = parse_flat(
        flat(
            timeout_seconds=5,
            inputs={
                "df": {"content_type": "arrow/ipc", "file": "df.arrow"},
                "w": {},
                "h": {
                    "content_type": "module/cell",
                    "file": "h.cell_module.json",
                    "injected": {"k": {"content_type": "json/object", "file": "k.json"}},
                },
            },
            env={"A": "b"},
            build_id="b1",
            mutation_defines=[],
            tables={},
        )
    )
    assert request.timeout_seconds == 5.0
    assert [spec.file for spec in request.inputs] == ["df.arrow", "w.pickle", "h.cell_module.json"]
    assert request.inputs[2].injected == (
        InjectedSpec("k", "json/object", "__inj_3_0.json", ("k.json", "k")),
    )
    assert request.build_id == "b1"


# ---- the reference's exact details ---------------------------------------------------


def test_invalid_json() -> None:
    with pytest.raises(BadRequest) as info:
        parse_execute_v1(b"{nope")
    assert info.value.detail.startswith("Invalid metadata: Expecting property name")


def test_metadata_nested_deeper_than_python_parses_is_a_bad_request() -> None:
    for parse in (parse_execute_v1, parse_notebook_execute):
        with pytest.raises(BadRequest) as info:
            parse(b"[" * 100_000 + b"]" * 100_000)
        assert info.value.detail.startswith("Invalid metadata: maximum recursion depth exceeded")


def test_invalid_utf8() -> None:
    with pytest.raises(BadRequest) as info:
        parse_notebook_execute(b'{"a": "\xff"}')
    assert info.value.detail.startswith("Invalid metadata: 'utf-8' codec can't decode")


@pytest.mark.parametrize("body", [b"[]", b"3", b'"x"', b"null"])
def test_metadata_not_an_object(body: bytes) -> None:
    for parse in (parse_execute_v1, parse_notebook_execute):
        with pytest.raises(BadRequest) as info:
            parse(body)
        assert info.value.detail.startswith("Invalid metadata: expected a JSON object, got ")


@pytest.mark.parametrize(
    ("version", "shown"), [("v2", "v2"), (1, "1"), ("notebook-cell-v1", "notebook-cell-v1")]
)
def test_v1_protocol_version(version: Any, shown: str) -> None:  # null: left out, v1
    assert v1_detail(v1(protocol_version=version)) == (
        f"Unsupported protocol version: {shown}. Expected: v1"
    )


def test_flat_protocol_version_required() -> None:
    envelope = flat()
    del envelope["protocol_version"]
    assert flat_detail(envelope) == (
        "Unsupported protocol version: None. Expected: notebook-cell-v1"
    )
    assert flat_detail(flat(protocol_version="v1")) == (
        "Unsupported protocol version: v1. Expected: notebook-cell-v1"
    )


def test_unsupported_transform() -> None:
    envelope = v1()
    envelope["transform"]["ref"] = "other@v1"
    assert v1_detail(envelope) == "Unsupported transform: other@v1. Expected: notebook_cell@v1"
    del envelope["transform"]["ref"]
    assert v1_detail(envelope) == "Unsupported transform: . Expected: notebook_cell@v1"
    assert v1_detail({"protocol_version": "v1"}) == (
        "Unsupported transform: . Expected: notebook_cell@v1"
    )


def test_transform_and_params_must_be_objects() -> None:
    assert v1_detail({"transform": []}) == "transform must be an object, not a list"
    assert v1_detail({"transform": {"ref": "notebook_cell@v1", "params": 3}}) == (
        "transform.params must be an object, not a number"
    )


def test_inputs_must_be_a_list() -> None:
    assert v1_detail(v1(inputs={"df": {}})) == "inputs must be a list"


def test_input_descriptor_must_be_an_object() -> None:
    assert v1_detail(v1(inputs=["df"])) == "input descriptor must be an object"


@pytest.mark.parametrize("descriptor", [{}, {"name": ""}, {"name": "   "}])
def test_input_descriptor_missing_name(descriptor: dict[str, Any]) -> None:
    assert v1_detail(v1(inputs=[descriptor])) == "input descriptor missing name"


def test_input_descriptor_name_type() -> None:
    assert v1_detail(v1(inputs=[{"name": 3}])) == (
        "input descriptor name must be a string, not a number"
    )


@pytest.mark.parametrize("file", ["..", ".", "a/..", "dir/", "a\\b", "a\x00b"])
def test_file_not_a_plain_file_name(file: str) -> None:
    assert v1_detail(v1(inputs=[{"name": "x", "file": file}])) == (
        f"Input file name {file!r} is not a plain file name"
    )
    assert flat_detail(flat(inputs={"x": {"file": file}})) == (
        f"Input file name {file!r} is not a plain file name"
    )


@pytest.mark.parametrize(
    ("sent", "file"), [("a/b.json", "b.json"), ("../x.json", "x.json"), ("/etc/x.json", "x.json")]
)
def test_only_the_last_component_of_a_file_path_counts(sent: str, file: str) -> None:
    """As in the reference: the staged file is the path's last component, and the upload
    may be named either way."""
    for request in (
        parse_v1(v1(inputs=[{"name": "x", "format": "json/object", "file": sent}])),
        parse_flat(flat(inputs={"x": {"content_type": "json/object", "file": sent}})),
    ):
        spec = request.inputs[0]
        assert spec.file == file
        assert sent in spec.part_names and file in spec.part_names


@pytest.mark.parametrize("file", ["__part_0001", "__inj_0_0.pickle"])
def test_file_with_reserved_prefix(file: str) -> None:
    assert v1_detail(v1(inputs=[{"name": "x", "file": file}])) == (
        f"Input file name {file!r} starts with a prefix reserved for the worker"
    )


def test_file_name_too_long() -> None:
    file = "a" * 256
    assert v1_detail(v1(inputs=[{"name": "x", "file": file}])).endswith("is longer than 255 bytes")
    assert v1_detail(v1(inputs=[{"name": "x" * 250, "format": "arrow/ipc"}])).endswith(
        "is longer than 255 bytes"
    )


def test_file_must_be_a_string() -> None:
    assert v1_detail(v1(inputs=[{"name": "x", "file": 3}])) == (
        "The file of input 'x' must be a string, not a number"
    )


def test_flat_inputs_must_be_an_object() -> None:
    assert flat_detail(flat(inputs=[])) == "inputs must be an object"


def test_flat_input_spec_must_be_an_object() -> None:
    assert flat_detail(flat(inputs={"df": "df.arrow"})) == "Input spec for df must be an object"


@pytest.mark.parametrize("name", ["1x", "a-b", "class", "None", "x y", "é-"])
def test_input_name_must_be_an_identifier(name: str) -> None:
    assert v1_detail(v1(inputs=[{"name": name}])) == (
        f"Input name {name!r} is not a Python identifier"
    )
    assert flat_detail(flat(inputs={name: {}})) == f"Input name {name!r} is not a Python identifier"


def test_unicode_identifier_is_accepted() -> None:
    assert parse_v1(v1(inputs=[{"name": "données"}])).inputs[0].file == "données.pickle"


def test_duplicate_input_name() -> None:
    assert v1_detail(v1(inputs=[{"name": "df"}, {"name": "df", "file": "b.pickle"}])) == (
        "Duplicate input name 'df'"
    )


def test_duplicate_input_file() -> None:
    inputs = [{"name": "a", "file": "same.bin"}, {"name": "b", "file": "same.bin"}]
    assert v1_detail(v1(inputs=inputs)) == "Duplicate input file name 'same.bin'"


def test_unknown_format() -> None:
    detail = v1_detail(v1(inputs=[{"name": "p", "format": "image/png"}]))
    assert detail.startswith("Unsupported format 'image/png' for input 'p'. Known: ")
    assert "arrow/ipc" in detail and "module/cell-instance" in detail
    assert flat_detail(flat(inputs={"p": {"content_type": 5}})) == (
        "The format of input 'p' must be a string, not a number"
    )


def test_injected_only_on_module_cell() -> None:
    inputs = [{"name": "x", "format": "json/object", "injected": {"n": {}}}]
    assert v1_detail(v1(inputs=inputs)) == (
        "Input 'x' carries injected values, but only module/cell inputs take them"
    )


def test_empty_injected_is_nothing() -> None:
    request = parse_v1(v1(inputs=[{"name": "x", "format": "json/object", "injected": {}}]))
    assert request.inputs[0].injected == ()


@pytest.mark.parametrize(
    ("injected", "detail"),
    [
        ([], "injected of input 'h' must be an object"),
        ({"n": 3}, "The injected value 'n' of input 'h' must be an object"),
        (
            {"1n": {}},
            "The name of the injected value '1n' of input 'h' is not a Python identifier",
        ),
        (
            {"n": {"content_type": "x/y"}},
            "Unsupported format 'x/y' for injected value 'n' of input 'h'. Known: ",
        ),
        (
            {"n": {"file": ["a"]}},
            "The file of injected value 'n' of input 'h' must be a string, not a list",
        ),
    ],
)
def test_injected_refusals(injected: Any, detail: str) -> None:
    inputs = [{"name": "h", "format": "module/cell", "injected": injected}]
    assert v1_detail(v1(inputs=inputs)).startswith(detail)


@pytest.mark.parametrize(
    ("timeout", "detail"),
    [
        ("abc", "timeout_seconds must be a number, not 'abc'"),
        ([1], "timeout_seconds must be a number, not a list"),
        (True, "timeout_seconds must be a number, not a boolean"),
        (-1, "timeout_seconds must be greater than 0, not -1"),
        (0, "timeout_seconds must be greater than 0, not 0"),
        ("-0.5", "timeout_seconds must be greater than 0, not -0.5"),
        ("inf", "timeout_seconds must be finite, not inf"),
        ("nan", "timeout_seconds must be finite, not nan"),
        (10**400, "timeout_seconds must be a number, not "),
    ],
)
def test_timeout_refusals(timeout: Any, detail: str) -> None:
    assert v1_detail(v1(params={"timeout_seconds": timeout})).startswith(detail)
    assert flat_detail(flat(timeout_seconds=timeout)).startswith(detail)


def test_timeout_nan_literal() -> None:
    raw = b'{"transform": {"ref": "notebook_cell@v1", "params": {"timeout_seconds": NaN}}}'
    with pytest.raises(BadRequest) as info:
        parse_execute_v1(raw)
    assert info.value.detail == "timeout_seconds must be finite, not nan"


@pytest.mark.parametrize(
    ("env", "detail"),
    [
        ([], "env must be an object, not a list"),
        ({"A": None}, "env value of A must be a string, a number or a boolean, not null"),
        ({"A": {"b": 1}}, "env value of A must be a string, a number or a boolean, not an object"),
        ({"A": [1]}, "env value of A must be a string, a number or a boolean, not a list"),
        ({"": "x"}, "env name '' is not a valid variable name"),
        ({"A=B": "x"}, "env name 'A=B' is not a valid variable name"),
        ({"A": "x\x00y"}, "env value of A holds a NUL or a lone surrogate"),
    ],
)
def test_env_refusals(env: Any, detail: str) -> None:
    assert v1_detail(v1(params={"env": env})) == detail


def test_env_coerces_scalars() -> None:
    env = parse_v1(v1(params={"env": {"A": 1, "B": 1.5, "C": True, "D": "d"}})).env
    assert dict(env) == {"A": "1", "B": "1.5", "C": "True", "D": "d"}


def test_source_must_be_a_string() -> None:
    assert v1_detail(v1(params={"source": 5})) == "source must be a string, not a number"
    assert flat_detail(flat(source=["x = 1"])) == "source must be a string, not a list"


def test_source_with_lone_surrogate() -> None:
    raw = b'{"transform": {"ref": "notebook_cell@v1", "params": {"source": "\\ud800"}}}'
    with pytest.raises(BadRequest) as info:
        parse_execute_v1(raw)
    assert info.value.detail == "source is not valid Unicode text (it holds a lone surrogate)"


@pytest.mark.parametrize("defines", ["df", [1], {"a": 1}])
def test_mutation_defines_refusals(defines: Any) -> None:
    assert v1_detail(v1(params={"mutation_defines": defines})) == (
        "mutation_defines must be a list of strings"
    )


def test_tables_refusals() -> None:
    assert v1_detail(v1(params={"tables": []})) == "tables must be an object, not a list"
    assert v1_detail(v1(params={"tables": {"t": {"snapshot_id": 1}}})) == (
        "Table 't' must be an object with a string uri"
    )
    for snapshot in ("5", 1.5, True, {}):
        detail = v1_detail(v1(params={"tables": {"t": {"uri": "u", "snapshot_id": snapshot}}}))
        assert detail.startswith("The snapshot_id of table 't' must be an integer or null, not ")
    tables = {"t": {"uri": "u", "snapshot_id": 7}, "n": {"uri": "v", "snapshot_id": None}}
    assert dict(parse_v1(v1(params={"tables": tables})).tables) == tables
    for name in ("a-b", "class", "", "1t"):
        detail = v1_detail(v1(params={"tables": {name: {"uri": "strata://table/t"}}}))
        assert detail == f"Table name '{name}' is not a Python identifier"


def test_build_id_must_be_a_string() -> None:
    assert v1_detail(v1(build_id=5)) == "build_id must be a string, not a number"


@pytest.mark.parametrize(("language", "shown"), [("R", "'R'"), ("julia", "'julia'")])
def test_unsupported_language(language: Any, shown: str) -> None:
    assert v1_detail(v1(params={"language": language})) == f"unsupported cell language {shown}"
    assert flat_detail(flat(language=language)) == f"unsupported cell language {shown}"


def test_r_is_a_language() -> None:  # whether this worker can run it is the service's to say
    assert parse_v1(v1(params={"language": "r"})).language == "r"
    assert parse_v1(v1(params={})).language == "python"


@pytest.mark.parametrize(
    ("language", "shown"), [(5, "a number"), (False, "a boolean"), ([], "a list")]
)
def test_language_must_be_a_string(language: Any, shown: str) -> None:
    assert v1_detail(v1(params={"language": language})) == f"language must be a string, not {shown}"
    assert parse_v1(v1(params={"language": ""})).language == "python"  # the reference's default


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"lock": "x"}, "environment.key must be a sha256 hex digest"),
        ([], "environment must be an object"),
        ({}, "environment.key must be a sha256 hex digest"),
        (
            {"key": "a" * 64, "lockfile": "", "pyproject": ""},
            "environment.lockfile does not match environment.key",
        ),
        (
            {"key": "a" * 64, "lockfile": 1, "pyproject": ""},
            "environment needs lockfile and pyproject text",
        ),
    ],
)
def test_a_malformed_locked_environment_is_the_references_500(
    environment: Any, message: str
) -> None:
    with pytest.raises(EnvironmentFailed) as raised:
        parse_v1(v1(params={"environment": environment}))
    assert raised.value.detail == f"locked environment: {message}"
    assert status_for(raised.value) == 500


def test_a_locked_environment_is_parsed_with_its_key_checked() -> None:
    lockfile = 'version = 1\nrequires-python = ">=3.12"\n'
    raw = {
        "key": lock_key(lockfile),
        "python": "3.12",
        "lockfile": lockfile,
        "pyproject": "[project]",
    }
    cell = parse_v1(v1(params={"environment": raw}))
    assert cell.environment is not None and cell.environment.key == raw["key"]
    assert cell.environment.python == "3.12"
    assert parse_v1(v1(params={"environment": None})).environment is None


# ---- mounts --------------------------------------------------------------------------


def test_mounts_must_be_a_list() -> None:
    assert v1_detail(v1(params={"mounts": {}})) == "mounts must be a list"
    assert flat_detail(flat(mounts="s3://b")) == "mounts must be a list"


@pytest.mark.parametrize("uri", ["file:///data", "/data", "data/x", "FILE:///x"])
def test_local_mount_refused_with_reference_detail(uri: str) -> None:
    assert v1_detail(v1(params={"mounts": [{"name": "data", "uri": uri}]})) == (
        "Remote execution does not support file:// mount 'data'"
    )


def test_s3_mounts_are_parsed() -> None:
    mounts = [{"name": "data", "uri": "s3://bucket/prefix", "mode": "rw"}]
    (spec,) = parse_v1(v1(params={"mounts": mounts})).mounts
    assert (spec.name, spec.uri, spec.mode) == ("data", "s3://bucket/prefix", "rw")


@pytest.mark.parametrize(("scheme", "package"), [("gs", "gcsfs"), ("az", "adlfs")])
def test_mounts_whose_backend_is_missing_name_the_package(scheme: str, package: str) -> None:
    mounts = [{"name": "data", "uri": f"{scheme}://bucket/prefix"}]
    assert package in v1_detail(v1(params={"mounts": mounts}))


def test_other_mount_scheme_named() -> None:
    mounts = [{"name": "data", "uri": "http://example.com/x"}]
    assert v1_detail(v1(params={"mounts": mounts})) == (
        "Unsupported mount URI scheme 'http' for mount 'data' (supported: s3, gs, gcs, az, azure)"
    )


@pytest.mark.parametrize(
    ("mount", "detail"),
    [
        ("s3://x", "mount 0 must be an object"),
        ({"uri": "s3://x"}, "mount 0 needs a name that is an identifier"),
        ({"name": "a-b", "uri": "s3://x"}, "mount 0 needs a name that is an identifier"),
        ({"name": "d"}, "Mount 'd' needs a uri"),
        ({"name": "d", "uri": 3}, "Mount 'd' needs a uri"),
        ({"name": "d", "uri": "s3://x", "mode": "wo"}, "Mount 'd' mode must be 'ro' or 'rw'"),
        ({"name": "d", "uri": "s3://[::1"}, "Mount 'd' has a malformed uri"),
    ],
)
def test_mount_shape_refusals(mount: Any, detail: str) -> None:
    assert v1_detail(v1(params={"mounts": [mount]})) == detail


def test_empty_mounts_accepted() -> None:
    assert parse_flat(flat(mounts=[])).mounts == ()


def test_long_values_are_cut_short_in_details() -> None:
    detail = v1_detail(v1(protocol_version="v" * 10_000))
    assert len(detail) < 300 and detail.endswith("…. Expected: v1")
