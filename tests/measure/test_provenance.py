"""A recording names the machine, the versions and the date it was made on."""

import datetime
import os

import jax

import gclab
from gclab.measure import machine, plan_only_options


def test_machine_names_hardware_versions_and_date():
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    record = machine(simulated_devices=jax.device_count())
    after = datetime.datetime.now(datetime.timezone.utc)
    assert record["backend"] == jax.default_backend()
    assert record["device"] == jax.devices()[0].device_kind
    assert record["jax"] == jax.__version__ and record["gclab"] == gclab.__version__
    assert record["simulated_devices"] == jax.device_count()
    assert record["cpu_count"] >= 1 and record["load_average_1min"] >= 0
    assert record["plan_only_options"] == plan_only_options()
    assert record["xla_flags"] == os.environ.get("XLA_FLAGS", "")
    assert before <= datetime.datetime.fromisoformat(record["date"]) <= after
