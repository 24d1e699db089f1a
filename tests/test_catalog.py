"""The catalog: the built-in facts, and a user's catalog laid over them; a bad catalog, an alias
bomb, binary bytes, a key given twice and an oversized file included, is one line."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from exporter.catalog import CatalogError, builtin_catalog, catalog_from_file, load_catalog
from exporter.documents import MAX_DOCUMENT_BYTES
from tests.yaml_bombs import alias_bomb

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)


def test_builtin_catalog_has_the_reference_facts() -> None:
    catalog = builtin_catalog()
    h100 = catalog.find("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    assert h100.key == "h100-sxm"
    assert h100.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert h100.memory_bandwidth_bytes_per_second == 3.35e12
    assert h100.mig_profiles[0].profile == "1g.10gb"
    price = catalog.price(h100)
    assert price is not None
    assert (price.usd_per_hour, price.instance) == (6.88, "p5.48xlarge")
    assert price.source_date == catalog.source_date == "2026-06"
    assert catalog_from_file(None) is catalog


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    return path


def test_a_user_entry_for_a_builtin_model_replaces_only_the_fields_it_names(tmp_path: Path) -> None:
    catalog = catalog_from_file(
        write(
            tmp_path,
            """
            default_price: {provider: onprem, region: dc1}
            models:
              - key: l4
                prices:
                  - {provider: onprem, region: dc1, usd_per_hour: 0.31, source_date: "2026-10"}
            """,
        )
    )
    l4 = catalog.by_key("l4")
    assert l4 is not None
    assert l4.memory_bandwidth_bytes_per_second == 300e9  # kept from the built-in entry
    price = catalog.price(l4)
    assert price is not None
    assert (price.provider, price.usd_per_hour, price.source_date) == ("onprem", 0.31, "2026-10")
    assert len(catalog.models) == len(builtin_catalog().models)


def test_a_user_entry_with_a_new_key_adds_a_model(tmp_path: Path) -> None:
    catalog = catalog_from_file(
        write(
            tmp_path,
            """
            source_date: "2026-11"
            models:
              - key: rtx-pro-6000
                name: RTX PRO 6000
                nvml_names: ["NVIDIA RTX PRO 6000 Blackwell Server Edition"]
                architecture: blackwell
                memory_gib: 96
                memory_bandwidth_gbps: 1792
                tdp_watts: 600
                peak_tflops: {fp32: 120}
                prices: [{provider: aws, region: us-east-1, usd_per_hour: 4.2}]
            """,
        )
    )
    model = catalog.find("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert model is not None
    price = catalog.price(model)
    assert price is not None
    assert price.source_date == "2026-11"
    l4 = catalog.find("NVIDIA L4")
    assert l4 is not None
    builtin_price = catalog.price(l4)
    assert builtin_price is not None
    assert builtin_price.source_date == "2026-06", "the built-in prices keep their own date"


def test_extend_builtin_false_makes_the_file_the_whole_catalog(tmp_path: Path) -> None:
    catalog = catalog_from_file(
        write(
            tmp_path,
            """
            extend_builtin: false
            models:
              - {key: x1, name: X1, nvml_names: [X1], architecture: hopper, memory_gib: 1,
                 memory_bandwidth_gbps: 1, tdp_watts: 1}
            """,
        )
    )
    assert [model.key for model in catalog.models] == ["x1"]


def test_a_source_date_may_be_a_yaml_date(tmp_path: Path) -> None:
    catalog = load_catalog(
        write(
            tmp_path,
            """
            source_date: 2026-06-01
            models:
              - {key: x1, name: X1, nvml_names: [X1], architecture: hopper, memory_gib: 1,
                 memory_bandwidth_gbps: 1, tdp_watts: 1,
                 prices: [{provider: onprem, region: dc1, usd_per_hour: 1}]}
            """,
        )
    )
    assert catalog.source_date == catalog.models[0].prices[0].source_date == "2026-06-01"


_NEW_MODEL = (
    "{key: x1, name: X1, nvml_names: [X1], architecture: hopper, memory_gib: 1, "
    "memory_bandwidth_gbps: 1, tdp_watts: 1}"
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [{key: l4, prise: 1}]", "models[0]: unknown field 'prise'"),
        (
            "models: [{key: new}]",
            (
                "models[0]: missing fields name, nvml_names, architecture, memory_gib, "
                "memory_bandwidth_gbps, tdp_watts"
            ),
        ),
        ("models: [{name: nameless}]", "models[0]: missing field key"),
        ("models: {l4: {}}", "models: expected a list, got a mapping"),
        ("modles: []", "unknown field 'modles'"),
        ("extend_builtin: maybe", "extend_builtin: expected true or false, got 'maybe'"),
        ("extend_builtin: false", "missing field models"),
        ("models: [{key: l4, memory_gib: -1}]", "models[0].memory_gib: must be greater than 0"),
        (
            "models: [{key: l4, peak_tflops: {fp4: 1}}]",
            "models[0].peak_tflops: unknown field 'fp4'",
        ),
        (
            "models: [{key: l4, peak_tflops: {bf16: '121'}}]",
            "models[0].peak_tflops.bf16: expected a number, got a string",
        ),
        (
            "models: [{key: l4, architecture: Hopper}]",
            (
                "models[0].architecture: 'Hopper' is not one of kepler, maxwell, pascal, volta, "
                "turing, ampere, ada, hopper, blackwell"
            ),
        ),
        ("models: [{key: l4}, {key: l4}]", "models[1].key: 'l4' is already the key of models[0]"),
        (
            "models: [{key: L4}]",
            "models[0].key: 'L4' is not a catalog key (lower-case letters, digits, - and .)",
        ),
        (
            "models: [{key: l4, nvml_names: 'NVIDIA L4'}]",
            "models[0].nvml_names: expected a list, got a string",
        ),
        ("models: [{key: l4, nvml_names: []}]", "models[0].nvml_names: expected at least 1 entry"),
        (
            "models: [{key: l4, prices: [{provider: onprem, region: dc1}]}]",
            "models[0].prices[0]: missing field usd_per_hour",
        ),
        (
            (
                "models: [{key: a100-sxm4-80gb, mig: [{profile: 8g.80gb, compute_slices: 8, "
                "memory_slices: 8, memory_gib: 80, max_instances: 1}]}]"
            ),
            "models[0].mig[0].compute_slices: 8 is outside 1..7",
        ),
        (f"models: [{_NEW_MODEL}, {{key: l4, fans: -1}}]", "models[1].fans: -1 is outside 0..64"),
        ("default_price: aws", "default_price: expected a mapping, got a string"),
        ("version: 2\nmodels: []", "version: 2 is not 1, the version this gpuscope reads"),
        ("models: [", "not valid YAML at line 2: did not find expected node content"),
        ("- just a list", "expected a mapping, got a list"),
        ("models: []\nmodels: []", "key 'models' appears twice in one mapping (line 2)"),
        (
            "models: [{key: l4, tdp_watts: 1, tdp_watts: 2}]",
            "key 'tdp_watts' appears twice in one mapping (line 1)",
        ),
        (alias_bomb(), "expands to more than 100,000 values (aliases repeated?)"),
        ("a: &a [1, *a]", "an alias contains itself (line 1)"),
    ],
)
def test_a_bad_user_catalog_is_one_line_naming_file_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    started = time.monotonic()
    with pytest.raises(CatalogError) as raised:
        catalog_from_file(path)
    assert str(raised.value) == f"{path}: {message}"
    assert time.monotonic() - started < 5


def test_binary_and_oversized_catalogs_are_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"models: []\n\x89PNG\r\n\x1a\n")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# padding\n" * (MAX_DOCUMENT_BYTES // 10 + 1))
    cases = {
        binary: f"{binary}: not UTF-8 text (byte 11 is 0x89)",
        big: f"{big}: larger than 1 MiB (the limit)",
        tmp_path
        / "none.yaml": f"{tmp_path / 'none.yaml'}: cannot read it: No such file or directory",
    }
    for path, message in cases.items():
        for load in (catalog_from_file, load_catalog):
            with pytest.raises(CatalogError) as raised:
                load(path)
            assert str(raised.value) == message
