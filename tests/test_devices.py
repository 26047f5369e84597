"""One rule for usable memory: the allocator's limit, or a named card times JAX's fraction."""

import math

import numpy as np
import pytest

from gclab import devices
from gclab.devices import (
    CARDS,
    DEVICE_CLASSES,
    FIT_MARGIN,
    card_usable_bytes,
    device_class_of,
    fits,
    mem_fraction,
    usable_bytes,
)
from gclab.sizing import planner


class FakeDevice:
    """A device description: what `memory_stats()` would return on a GPU."""

    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def test_a_present_device_reports_its_allocator_limit():
    assert usable_bytes(FakeDevice({"bytes_limit": 11_000_000_000, "bytes_in_use": 5})) == \
        11_000_000_000
    assert usable_bytes(FakeDevice(None)) is None  # CPU
    assert usable_bytes(FakeDevice(RuntimeError("no stats"))) is None


def test_this_cpu_reports_no_limit():
    assert usable_bytes() is None


#: What CUDA reports as a T4's memory (deviceQuery on Colab's T4: "15102 MBytes (15835660288
#: bytes)", PyTorch's "14.75 GiB total capacity"): not the printed 16 GB.
T4_CUDA_TOTAL = 15_835_660_288


@pytest.fixture
def no_fraction(monkeypatch):
    """Neither of the names JAX reads for its GPU pool's share is set."""
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)


def test_a_named_card_gets_jax_default_fraction(monkeypatch, no_fraction):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # changes nothing
    assert card_usable_bytes("T4") == int(0.75 * T4_CUDA_TOTAL)
    assert card_usable_bytes("h100") == 60 * 10**9
    assert usable_bytes(card_name="A100-40GB") == 30 * 10**9
    # TPU memory is per chip, in GiB, and has no client fraction.
    assert card_usable_bytes("TPU-v4") == 32 * 2**30


def test_the_fraction_follows_the_environment(monkeypatch, no_fraction):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")
    assert mem_fraction() == 0.5 and card_usable_bytes("L4") == 12 * 10**9
    for bad in ("0", "1.5", "lots"):
        monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", bad)
        with pytest.raises(ValueError, match=r"XLA_PYTHON_CLIENT_MEM_FRACTION=.* \(0, 1\]"):
            mem_fraction()


def test_the_fraction_is_read_by_the_name_jax_reads_first(monkeypatch, no_fraction):
    """jaxlib reads ``XLA_CLIENT_MEM_FRACTION``, else the deprecated
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``, and refuses both at once (``xla_client.py``)."""
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", ".5")
    assert mem_fraction() == 0.5 and card_usable_bytes("L4") == 12 * 10**9
    assert devices.mem_fraction_setting() == ("XLA_CLIENT_MEM_FRACTION", ".5")
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "lots")
    with pytest.raises(ValueError, match=r"^XLA_CLIENT_MEM_FRACTION='lots' is invalid: .*\(0, 1\]"):
        mem_fraction()
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", ".5")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")
    with pytest.raises(ValueError, match="XLA_CLIENT_MEM_FRACTION='.5' and "
                       "XLA_PYTHON_CLIENT_MEM_FRACTION='.5' are both set: JAX refuses both"):
        mem_fraction()
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION")
    assert devices.mem_fraction_setting() == ("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")


@pytest.mark.parametrize("env, line", [
    ({"XLA_CLIENT_MEM_FRACTION": "most"}, "XLA_CLIENT_MEM_FRACTION=most: a number in (0, 1]"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "most"},
     "XLA_PYTHON_CLIENT_MEM_FRACTION=most: a number in (0, 1]"),
    ({"XLA_CLIENT_MEM_FRACTION": ".5", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".6"},
     "XLA_CLIENT_MEM_FRACTION='.5' and XLA_PYTHON_CLIENT_MEM_FRACTION='.6' are both set"),
])
def test_gclab_plan_names_the_fraction_variable_at_fault(env, line, monkeypatch, capsys,
                                                         no_fraction):
    from gclab import cli

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["plan", "--resolution", "6", "--mesh-splits", "2", "--budget", "T4", "--compiled",
            "no"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and f"error: {line}" in err[-1], err


def test_the_t4_is_what_cuda_reports_and_the_planner_agrees_with_one(no_fraction):
    """A real T4's allocator limit is 0.75 of CUDA's total, 14.75 GiB: a 10 GiB plan fits
    neither it nor the planner's T4 (the printed 16 GB would let it fit the planner's)."""
    here = usable_bytes(FakeDevice({"bytes_limit": int(0.75 * T4_CUDA_TOTAL)}))
    assert planner.parse_budget("T4") == here
    plan = 10 * 2**30
    assert not fits(plan, here) and not fits(plan, planner.parse_budget("T4"))
    assert device_class_of(here).name == "16GB"


def test_unknown_card_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown card 'T5': one of T4, V100-16GB, L4"):
        devices.card("T5")


def test_cards_state_their_units():
    assert {c.unit for c in CARDS.values()} == {"GB", "GiB"}
    assert CARDS["H200"].memory_bytes == 141 * 10**9 and CARDS["H200"].describe() == \
        "H200 (141 GB)"
    assert CARDS["TPU-v4"].describe() == "TPU-v4 (32 GiB)"


def test_fits_leaves_the_margin():
    assert fits(FIT_MARGIN * 1000, 1000) and not fits(FIT_MARGIN * 1000 + 1, 1000)


def test_device_classes_cover_the_cards_from_small_to_large():
    usable = [c.usable_bytes for c in DEVICE_CLASSES.values()]
    assert list(DEVICE_CLASSES) == ["cpu", "16GB", "24GB", "40GB", "80GB", "141GB"]
    assert usable[1:] == sorted(usable[1:])
    assert device_class_of(None).name == "cpu"
    # A card smaller than a T4 reaches no GPU class: it runs the cpu class's configurations.
    assert device_class_of(2 * 2**30).name == "cpu"
    assert device_class_of(10**15).name == "141GB"
    for cls in DEVICE_CLASSES.values():
        assert 0 < cls.budget_bytes < cls.usable_bytes


def test_the_planner_uses_the_same_rule():
    assert planner.parse_budget("T4") == card_usable_bytes("T4")
    assert planner.CARDS is CARDS


def test_a_card_below_the_smallest_gpu_class_is_of_the_cpu_class():
    """An 8 GB card's pool (6 GB) holds less than the 16 GB class's budget, so it is no
    16 GB card; a T4 whose driver keeps a little back still is."""
    eight = int(0.75 * 8 * 10**9)
    assert eight < DEVICE_CLASSES["16GB"].budget_bytes
    assert device_class_of(eight) is DEVICE_CLASSES["cpu"]
    lowest = math.ceil(devices.CLASS_TOLERANCE * DEVICE_CLASSES["16GB"].usable_bytes)
    assert device_class_of(lowest).name == "16GB"
    assert device_class_of(lowest - 1).name == "cpu"
    assert device_class_of(np.int64(card_usable_bytes("L4"))).name == "24GB"


@pytest.mark.parametrize("call, error, words", [
    (lambda: fits(10, None), TypeError,
     "fits usable=None is invalid: a number of bytes >= 1 (usable_bytes() is None on a CPU)"),
    (lambda: fits(10, "1GB"), TypeError, "fits usable='1GB' is invalid: a number of bytes"),
    (lambda: fits(10, True), TypeError, "fits usable=True is invalid"),
    (lambda: fits(10, 0), ValueError, "fits usable=0 is invalid: a number of bytes >= 1"),
    (lambda: fits(10, float("nan")), ValueError, "fits usable=nan is invalid"),
    (lambda: fits("10", 100), TypeError, "fits plan_bytes='10' is invalid"),
    (lambda: fits(-1, 100), ValueError, "fits plan_bytes=-1 is invalid: a number of bytes >= 0"),
    (lambda: device_class_of("16GB"), TypeError,
     "device_class_of usable='16GB' is invalid: a number of bytes >= 1 or None (a CPU)"),
    (lambda: device_class_of(-5), ValueError, "device_class_of usable=-5 is invalid"),
])
def test_byte_counts_of_the_wrong_kind_or_size_are_refused_in_one_line(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(words) and "\n" not in str(info.value)


def test_fits_takes_numpy_numbers():
    assert fits(np.int64(900), np.float32(1000)) and not fits(np.float64(901), np.int32(1000))
