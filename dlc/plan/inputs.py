"""What the planning tools take: the failure model of `dlc simulate` and the link setup of `dlc bandwidth`.

Each is a typed model that owns its fields (default, unit, description) and checks them once, when
it is built. A value that makes no sense raises `SettingError`, which names settings by their
field; a front end spells those names its own way (`dlc` as command-line options).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dlc.errors import UserError

SECONDS_PER_YEAR = 365.25 * 86400.0
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True)
class Setting:
    """A setting named inside an error message."""

    name: str


class SettingError(UserError):
    """A planning input that makes no sense; the message keeps the settings it names apart from its text.

    `str()` names each setting by its field (`horizon_days=0.0 must be positive`); `spelled` names
    them the way a front end does (`--horizon-days=0.0 must be positive`).
    """

    def __init__(self, *parts: str | Setting) -> None:
        self.parts = parts
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell: Callable[[str], str]) -> str:
        return "".join(part if isinstance(part, str) else spell(part.name) for part in self.parts)


class PlanningInputs(BaseModel):
    # Numbers may be inf or nan here: the checks below refuse them with messages of their own.
    model_config = ConfigDict(extra="forbid", frozen=True)

    def check(self) -> None:
        """Run the checks again: a copy made with `model_copy(update=...)` skipped them."""
        type(self).model_validate(self.model_dump())


class RepairDist(StrEnum):
    """Shape of the time a failed slice spends out of service (the mean is a separate constant)."""

    FIXED = "fixed"
    """Every repair takes exactly the mean."""
    EXPONENTIAL = "exponential"
    """Memoryless repairs: most are quick, a few take many times the mean."""
    LOGNORMAL = "lognormal"
    """Right-skewed repairs (a reboot is quick, a board swap is slow); shape set by sigma."""


class FailureModel(PlanningInputs):
    """Every constant of the goodput simulation. Defaults reproduce the paper's goodput table."""

    mtbi_chip_years: float = Field(1.0, description="Mean time between interruptions of one chip, in years.")
    chips_per_slice: int = Field(64, description="Chips that a failure takes out together (one slice).")
    repair_dist: RepairDist = Field(
        RepairDist.LOGNORMAL, description="Repair-time shape: fixed, exponential or lognormal."
    )
    repair_mean_h: float = Field(4.2, description="Mean time a failed slice is out of service, hours.")
    repair_sigma: float = Field(1.0, description="Shape of lognormal repairs (sigma of the log).")
    pause_on_failure_s: float = Field(11.6, description="Elastic reconfiguration pause when a slice fails.")
    pause_on_return_s: float = Field(8.0, description="Elastic reconfiguration pause when a repaired slice rejoins.")
    dp_restart_s: float = Field(71.5, description="Plain DP: job restart after any failure, seconds.")
    dp_spare_ratio: float = Field(
        3.0, description="Plain DP: idle hot spares, as a multiple of the mean number of slices in repair."
    )
    horizon_days: float = Field(30.0, description="Simulated time, days.")

    @field_validator("repair_dist", mode="before")
    @classmethod
    def _known_shape(cls, value: Any) -> Any:
        if value not in {d.value for d in RepairDist}:
            shapes = ", ".join(d.value for d in RepairDist)
            raise SettingError(Setting("repair_dist"), f"={value!r} is not one of {shapes}")
        return value

    @model_validator(mode="after")
    def _makes_sense(self) -> FailureModel:
        positive = (
            "mtbi_chip_years",
            "chips_per_slice",
            "repair_mean_h",
            "pause_on_failure_s",
            "pause_on_return_s",
            "dp_restart_s",
            "horizon_days",
        )
        for name in positive:
            value = getattr(self, name)
            if not value > 0:  # also refuses nan
                raise SettingError(Setting(name), f"={value} must be positive: pass a value above 0")
        for name in (*positive, "repair_sigma", "dp_spare_ratio"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise SettingError(Setting(name), f"={value} must be a finite number")
        if self.repair_sigma < 0:
            raise SettingError(Setting("repair_sigma"), f"={self.repair_sigma} must be 0 or more")
        if self.dp_spare_ratio < 1:
            raise SettingError(
                Setting("dp_spare_ratio"),
                f"={self.dp_spare_ratio} holds fewer spares than there are slices in repair: plain DP would wait "
                "for repairs; pass 1 or more",
            )
        if self.dp_spare_fraction >= 0.5:
            raise SettingError(
                Setting("dp_spare_ratio"),
                f"={self.dp_spare_ratio} with {100 * self.repair_fraction:.3g}% of slices in repair reserves "
                f"{100 * self.dp_spare_fraction:.3g}% of chips as spares: shorten ",
                Setting("repair_mean_h"),
                ", shrink ",
                Setting("chips_per_slice"),
                " or lower the ratio",
            )
        return self

    @property
    def failures_per_chip_year(self) -> float:
        return 1.0 / self.mtbi_chip_years

    @property
    def repair_fraction(self) -> float:
        """Mean fraction of slices in repair: slice failure rate times mean repair time."""
        slice_rate_per_h = self.chips_per_slice / (self.mtbi_chip_years * SECONDS_PER_YEAR / SECONDS_PER_HOUR)
        return slice_rate_per_h * self.repair_mean_h

    @property
    def dp_spare_fraction(self) -> float:
        """Fraction of chips plain DP holds as idle hot spares."""
        return self.dp_spare_ratio * self.repair_fraction


class LinkSetup(PlanningInputs):
    """One WAN planning question: how fast must each site's link be. H, P and tau as in the paper."""

    params: float = Field(5e9, description="Model parameters.")
    step_time_s: float = Field(1.0, description="Compute time of one inner step, seconds.")
    sites: int = Field(2, description="Datacentres (sites) joined by the WAN.")
    utilisation: float = Field(0.9, description="Target compute utilisation, a fraction below 1.")
    bits_per_value: float = Field(16.0, description="Bits per value that DP and DiLoCo send (16: bf16).")
    fragments: int = Field(24, description="Fragments P; one is sent every H/P steps.")
    H: int = Field(100, description="H: inner steps between syncs.")
    tau: float = Field(2.0, description="Overlap: steps a decoupled fragment may take to come back.")
    backward_fraction: float = Field(
        2.0 / 3.0, description="Share of a step spent in the backward pass (gradients leave then)."
    )
    buckets: int = Field(32, description="Gradient buckets per backward pass in the simulation.")
    int4_block: int = Field(64, description="int4 values per block scale.")
    int4_scale_bits: int = Field(32, description="Bits of one int4 block scale (32: float32).")

    @model_validator(mode="after")
    def _makes_sense(self) -> LinkSetup:
        checks = [
            (self.params > 0, "params", "pass a positive count such as 5B"),
            (self.step_time_s > 0, "step_time_s", "pass a positive time"),
            (self.sites >= 2, "sites", "one site needs no WAN link; pass 2 or more"),
            (0 < self.utilisation < 1, "utilisation", "pass a fraction below 1, e.g. 0.9"),
            (self.bits_per_value > 0, "bits_per_value", "pass e.g. 16 for bf16"),
            (self.fragments >= 1, "fragments", "pass 1 or more"),
            (self.H >= 1, "H", "pass 1 or more"),
            (self.tau > 0, "tau", "pass a positive number of steps"),
            (0 < self.backward_fraction <= 1, "backward_fraction", "pass a fraction"),
            (self.buckets >= 1, "buckets", "pass 1 or more"),
            (self.int4_block >= 1, "int4_block", "pass 1 or more"),
            (self.int4_scale_bits >= 0, "int4_scale_bits", "pass 0 or more"),
        ]
        for ok, name, fix in checks:
            value = getattr(self, name)
            if not ok:
                raise SettingError(Setting(name), f"={value:g} is out of range: {fix}")
            if not math.isfinite(value):
                raise SettingError(Setting(name), f"={value:g} must be a finite number: {fix}")
        return self

    def sync_bits(self, bits_per_value: float) -> float:
        """S: bits each site's link carries for one all-reduce of every parameter."""
        return 2.0 * (1.0 - 1.0 / self.sites) * bits_per_value * self.params

    @property
    def int4_bits(self) -> float:
        """int4 values plus one block scale per ``int4_block`` values."""
        return 4.0 + self.int4_scale_bits / self.int4_block
