"""The rehearsal venv takes what the carried wheels need from the image, and nothing a site carries itself."""

from __future__ import annotations

from fsdp_matrix.device import rehearse
from tests.device.support import fake_wheel


def test_what_the_wheels_need_from_the_image_goes_into_the_venv(tmp_path):
    # transformers 4.46.3 imports requests; the image has it, a venv of transformers 5's time did not (the rehearsal
    # of 2026-11-28 failed on it): without this, the old site's imports fail here and not on the device
    fake_wheel(tmp_path / "peft0.13.0", "transformers", "4.46.3", ["requests", "huggingface-hub<1.0", "tokenizers"])
    fake_wheel(tmp_path / "base", "datasets", "5.2.0", ["pyarrow>=15", "dill<0.5", "torch; extra == 'torch'"])
    # requests and pyarrow: in the image, carried by no site; huggingface-hub and tokenizers: a site's own wants;
    # dill: not in the image (a site carries it); torch: only for an extra
    assert rehearse.image_needs(tmp_path) == ["pyarrow", "requests"]


def test_the_venv_pins_the_image_versions_and_leaves_the_carried_packages_out():
    assert rehearse.PINS == {"torch": "2.11.0", "transformers": "5.17.0", "accelerate": "1.15.0", "peft": "0.21.1"}
    assert not any(r.startswith(("pydantic", "bitsandbytes", "trl")) for r in rehearse.EXTRA)
