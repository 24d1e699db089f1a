"""The catalog: the built-in facts, and a user's catalog laid over them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.catalog import CatalogError, builtin_catalog, catalog_from_file, load_catalog

if TYPE_CHECKING:
    from pathlib import Path


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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: [{key: l4, prise: 1}]", r"models\[3\] \(l4\): unknown field\(s\) \['prise'\]"),
        ("models: [{key: new}]", r"\(new\): missing field 'name'"),
        ("models: [{name: nameless}]", r"models\[0\]: each model needs a `key`"),
        ("models: {l4: {}}", r"`models` must be a list"),
        ("modles: []", r"unknown field\(s\) \['modles'\]"),
        ("extend_builtin: maybe", r"extend_builtin must be true or false"),
        (
            "models: [{key: l4, memory_gib: -1}]",
            r"memory_gib must be a finite number, not negative",
        ),
        ("models: [{key: l4, peak_tflops: {fp4: 1}}]", r"unknown dtype\(s\) \['fp4'\]"),
        ("default_price: aws", r"default_price must be a mapping"),
        ("version: 2\nmodels: []", r"version 2 is not 1"),
        ("models: [", r"cannot read catalog"),
        ("- just a list", r"expected a mapping with a `models` list"),
    ],
)
def test_a_bad_user_catalog_is_one_line_naming_file_and_entry(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(CatalogError, match=message) as raised:
        catalog_from_file(path)
    assert str(raised.value).startswith(str(path))
    assert "\n" not in str(raised.value)


def test_a_missing_file_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="No such file or directory"):
        load_catalog(tmp_path / "none.yaml")
