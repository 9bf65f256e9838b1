"""The catalog against published figures: Google's Cloud TPU docs and pricing, the scaling book.

Sources (also in tpunb/data/catalog.json "sources"):
  [book]  Austin et al., "How to Scale Your Model", part 2 "How to Think About TPUs" (tpus.md),
          part 5 "Training" and part 8 "Serving LLaMA 3-70B on TPUs".
  [gcp]   cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e,tpu7x}, /types-topologies, /regions-zones.
  [price] cloud.google.com/tpu/pricing as quoted by public catalogs (SkyPilot): tpu-v6e-8 in
          us-central1 costs $21.60/h on demand and $6.24/h spot.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tpunb.provision.gcp import apis
from tpunb import catalog
from tpunb.catalog import Accelerator, check_zone, lookup, table
from tpunb.errors import ProvisionError, TpunbError, UnknownAcceleratorError

GIB = 2**30


@pytest.mark.parametrize(
    "name, canonical, chips, hosts, per_host, devices",
    [
        ("tpu-v4-16", "v4-16", 8, 2, 4, 8),  # suffix counts TensorCores, 4 chips per VM [gcp]
        ("v4-16", "v4-16", 8, 2, 4, 8),
        ("V4-16", "v4-16", 8, 2, 4, 8),
        ("v2-8", "v2-8", 4, 1, 8, 8),  # 2 TensorCores per chip, each a JAX device
        ("v3-32", "v3-32", 16, 4, 8, 32),
        ("v5litepod-8", "v5litepod-8", 8, 1, 8, 8),  # v5e single host holds 8 chips [gcp v5e]
        ("v5e-8", "v5litepod-8", 8, 1, 8, 8),
        ("v5litepod-16", "v5litepod-16", 16, 4, 4, 16),
        ("v5p-8", "v5p-8", 4, 1, 4, 4),  # megacore: one device per chip
        ("v6e-16", "v6e-16", 16, 4, 4, 16),
        ("tpu-v6e-8", "v6e-8", 8, 1, 8, 8),
    ],
)
def test_lookup_shapes(name, canonical, chips, hosts, per_host, devices):
    acc = lookup(name)
    assert isinstance(acc, Accelerator)
    assert acc.name == canonical
    assert (acc.chips, acc.hosts, acc.devices_per_host, acc.devices) == (chips, hosts, per_host, devices)
    assert acc.chips_per_host * acc.hosts == acc.chips
    assert acc.devices_per_host * acc.hosts == acc.devices


def test_tensorcores_and_topology():
    acc = lookup("v4-32")
    assert (acc.tensorcores, acc.topology, acc.generation) == (32, "2x2x4", "v4")  # [gcp v4]
    assert lookup("v5p-12288").topology == "16x16x24"  # largest v5p shape [gcp v5p]
    assert lookup("v5litepod-256").topology == "16x16"
    assert lookup("v6e-8").generation == "v6e" and lookup("v5e-4").generation == "v5e"


@pytest.mark.parametrize("name, hosts", [("v4-4096", 512), ("v5p-12288", 1536), ("v6e-256", 64), ("v5litepod-256", 64)])
def test_pod_host_counts(name, hosts):
    assert lookup(name).hosts == hosts  # NOTES.md, Cloud TPU naming and hosts


@pytest.mark.parametrize(
    "gen, hbm_gb, hbm_bw, bf16, int8",
    [  # [book] tpus.md chip table (HBM in the book's GB; the chips carry binary GiB)
        ("v3", 32, 9.0e11, 1.4e14, 1.4e14),
        ("v4", 32, 1.2e12, 2.75e14, 2.75e14),
        ("v5p", 96, 2.8e12, 4.59e14, 9.18e14),
        ("v5e", 16, 8.1e11, 1.97e14, 3.94e14),
        ("v6e", 32, 1.6e12, 9.2e14, 1.84e15),
    ],
)
def test_chip_specs_match_the_book(gen, hbm_gb, hbm_bw, bf16, int8):
    acc = catalog.lookup(catalog.generation(gen).size_names()[0])
    assert acc.hbm_bytes_per_chip / GIB == pytest.approx(hbm_gb, rel=0.02)
    assert acc.hbm_bandwidth == pytest.approx(hbm_bw, rel=0.01)
    assert acc.bf16_flops == pytest.approx(bf16, rel=0.01)
    assert acc.int8_ops == pytest.approx(int8, rel=0.01)


def test_chip_specs_match_google_docs():
    # [gcp] v5e: 197 TFLOP/s, 819 GB/s; v6e: 918 TFLOP/s, 1638 GB/s; v4: 1200 GB/s; TPU7x: 192 GiB, 7380 GB/s
    assert lookup("v5e-1").bf16_flops == pytest.approx(197e12, rel=0.01)
    assert lookup("v5e-1").hbm_bandwidth == pytest.approx(819e9, rel=0.02)
    assert lookup("v6e-1").bf16_flops == pytest.approx(918e12, rel=0.01)
    assert lookup("v6e-1").hbm_bandwidth == pytest.approx(1638e9, rel=0.03)
    assert lookup("v4-8").hbm_bandwidth == pytest.approx(1200e9, rel=0.01)
    assert lookup("tpu7x-8").hbm_bytes_per_chip == 192 * GIB
    assert lookup("tpu7x-8").hbm_bandwidth == pytest.approx(7380e9, rel=0.01)
    assert (lookup("tpu7x-128").chips, lookup("tpu7x-128").devices) == (64, 128)  # 2 devices per chip


def test_book_derived_ratios():
    v5p, v5e = lookup("v5p-8"), lookup("v5e-1")
    # [book] part 5: C / W_ici = 4.6e14 / (2 * 9e10) ~ 2550 on v5p
    assert v5p.bf16_flops / (2 * v5p.ici_bandwidth) == pytest.approx(2550, rel=0.01)
    # [book] part 8: bf16 FFW blocks are compute-bound above batch ~240 on v5e
    assert v5e.bf16_flops / v5e.hbm_bandwidth == pytest.approx(240, rel=0.03)
    # [book] part 8 table: FLOPs/s per $/hour: v5p 1.09e14, v5e 1.64e14
    assert v5p.bf16_flops / v5p.price_per_chip_hour == pytest.approx(1.09e14, rel=0.01)
    assert v5e.bf16_flops / v5e.price_per_chip_hour == pytest.approx(1.64e14, rel=0.01)
    # [book] part 2 problem 2: a v5e pod does 16*16*2e14 = 5.1e16 FLOP/s
    assert lookup("v5litepod-256").peak_bf16_flops == pytest.approx(5.1e16, rel=0.02)


def test_prices():
    acc = lookup("tpu-v6e-8")
    assert acc.price_per_hour() == pytest.approx(21.60)  # [price]
    assert acc.price_per_hour(spot=True) == pytest.approx(6.24)
    assert lookup("v5p-8").price_per_hour() == pytest.approx(4 * 4.20)  # NOTES.md / [book] part 8
    assert lookup("v5litepod-4").price_per_hour() == pytest.approx(4 * 1.20)
    assert lookup("v2-8").price_per_hour() == pytest.approx(4.50)  # historical v2-8 list price
    with pytest.raises(TpunbError, match="no public"):
        lookup("tpu7x-8").price_per_hour()


def test_default_runtimes():
    # NOTES.md "Default runtime versions used by peers"
    assert lookup("v6e-8").default_runtime == "v2-alpha-tpuv6e"
    assert lookup("v5litepod-8").default_runtime == "v2-alpha-tpuv5-lite"
    assert lookup("v5p-8").default_runtime == "v2-alpha-tpuv5"
    assert lookup("v4-8").default_runtime == "tpu-ubuntu2204-base"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("v4-17", "did you mean v4-16 or v4-32?"),
        ("v5p-4", "did you mean v5p-8?"),
        ("v5litepod-2", "did you mean v5litepod-1 or v5litepod-4?"),
        ("v6e-512", "did you mean v6e-256?"),
        ("v5lightpod-8", "did you mean v5litepod-8"),
        ("v7-8", "tpu7x-8"),
        ("tpu-v4", "needs a size"),
        ("a100-8", "names look like"),
    ],
)
def test_unknown_names_give_one_line_with_suggestions(name, expected):
    with pytest.raises(UnknownAcceleratorError) as info:
        lookup(name)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert info.value._render_traceback_() == [f"UnknownAcceleratorError: {message}"]


def test_wrong_size_lists_valid_sizes():
    message = str(pytest.raises(UnknownAcceleratorError, lookup, "v4-17").value)
    assert message.startswith("unknown accelerator 'v4-17': v4 sizes are v4-8, v4-16, v4-32")
    assert "TensorCores" in message


def test_every_name_round_trips():
    for name in catalog.names():
        acc = lookup(name)
        assert acc.name == name
        assert acc.zones, f"{name}: somewhere Google offers it"
        assert set(apis.compute_zones(acc)) <= set(acc.zones), f"{name}: Compute Engine's zones are among Google's"
        assert acc.devices == acc.chips * catalog.generation(acc.generation).devices_per_chip


def test_lookup_is_cached():
    assert lookup("v4-16") is lookup("tpu-v4-16")


def test_check_zone():
    check_zone(lookup("v4-8"), "us-central2-b")  # the only v4 zone [gcp regions]
    check_zone("v6e-8", "us-east5-b")
    with pytest.raises(ProvisionError) as info:
        check_zone(lookup("v4-8"), "us-central1-a")
    assert "us-central2-b" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ProvisionError, match="other sizes"):
        check_zone("v2-32", "us-central1-b")  # only v2-8 there [gcp regions]


def test_every_source_is_cited():
    cited = {k for g in catalog.generations() for keys in g.sources.values() for k in keys}
    assert cited <= set(catalog.sources())
    assert all(s["url"].startswith("https://") for s in catalog.sources().values())
    for g in catalog.generations():
        assert g.sources["chip"] and g.sources["shape"] and g.sources["zones"]


def test_table_and_filters():
    df = table()
    assert len(df) == len(catalog.names())
    assert df.loc["v4-32", "chips"] == 16 and df.loc["v4-32", "hosts"] == 4
    assert set(table("v6e").generation) == {"v6e"}
    east5 = table("v5p v6e us-east5")
    assert set(east5.generation) == {"v5p", "v6e"}
    assert all("us-east5" in z for z in east5.zones)
    assert list(table("v4-32").index) == ["v4-32"]
    with pytest.raises(UnknownAcceleratorError):
        table("v9")


def test_import_is_light():
    code = "import sys, tpunb.catalog as c; c.lookup('v4-8'); print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_tpu_catalog_magic():
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "tpunb")
    df = ip.run_line_magic("tpu_catalog", "v5e")
    assert set(df.generation) == {"v5e"}


def test_hypothetical_full_pod():
    # [book] part 2 problem 2: a full v5p pod is 16x20x28 = 8960 chips on 2,240 hosts, ~4e18 bf16 FLOP/s
    pod = catalog.hypothetical("v5p", "16x20x28")
    assert (pod.chips, pod.hosts, pod.tensorcores) == (8960, 2240, 17920)
    assert pod.peak_bf16_flops == pytest.approx(4e18, rel=0.03)
    assert catalog.hypothetical("v5e", chips=256).topology == "16x16"
    with pytest.raises(TpunbError):
        catalog.hypothetical("v5p", "16x20x28", chips=100)
