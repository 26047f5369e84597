"""Synthetic weather: seeded, smooth fields on the sphere with the task's channel layout.

No data can be downloaded here, so training and measurement run on synthetic weather of
realistic shapes. Every variable is a mix of K smooth basis fields on the sphere,

    b_k(lat, lon, t) = cos(lat)^m_k cos(m_k lon - w_k t + phase_k) P_k(sin lat),

continuous at the poles (the zonal wavenumber m_k comes with cos(lat)^m_k) and drifting
slowly in time, so consecutive 6-hour frames are correlated and the residual to the next
frame is learnable. Atmospheric variables mix the basis smoothly across pressure levels.
Forcings follow the real definitions (top-of-atmosphere solar radiation from the solar
declination and hour angle; year and day progress as sin/cos); statics are a smooth
surface geopotential and a land-sea mask. Everything depends on the seed only.

Shapes: T frames, Ng grid nodes, B batch, O target channels, V input variables per frame,
C data channels, K basis fields.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from gclab.config import ATMOSPHERIC_VARIABLES, SURFACE_VARIABLES, TaskConfig
from gclab.training import Example, input_variable_channels

HOURS_PER_FRAME = 6.0
HOURS_PER_YEAR = 24.0 * 365.25
STATS_FRAMES = 24


class Normalization(NamedTuple):
    """Per-channel statistics that turn raw values into normalised units."""

    input_mean: np.ndarray  # [C]
    input_std: np.ndarray  # [C]
    residual_std: np.ndarray  # [O] std of frame-to-frame differences
    residual_scale: np.ndarray  # [O] residual_std / input std of the same variable


@dataclasses.dataclass(frozen=True, eq=False)
class SyntheticWeather:
    """Seeded synthetic weather for a task on a pole-inclusive lat/lon grid.

    Attributes:
      task: channel layout.
      resolution: grid spacing in degrees (divides 180).
      seed: everything is a function of the seed.
      basis: number K of smooth basis fields mixed into each variable.
    """

    task: TaskConfig
    resolution: float
    seed: int = 0
    basis: int = 24

    def __post_init__(self) -> None:
        from gclab.config import ModelConfig

        ModelConfig(resolution=self.resolution)  # validates the resolution
        if not isinstance(self.basis, int) or self.basis < 1:
            raise ValueError(f"SyntheticWeather.basis={self.basis!r} is invalid: an integer >= 1")
        rng = np.random.default_rng(self.seed)
        n_lat, n_lon = int(round(180 / self.resolution)) + 1, int(round(360 / self.resolution))
        lat = np.deg2rad(np.linspace(-90.0, 90.0, n_lat))
        lon = np.deg2rad(np.arange(n_lon) * self.resolution)
        lat_n, lon_n = np.repeat(lat, n_lon), np.tile(lon, n_lat)  # [Ng] latitude-major
        K = self.basis
        m = rng.integers(0, 5, K)  # zonal wavenumbers
        poly = rng.normal(0.0, 1.0, (K, 3))  # P_k(x) = c0 + c1 x + c2 x^2
        x = np.sin(lat_n)
        envelope = np.cos(lat_n)[:, None] ** m * (
            poly[:, 0] + poly[:, 1] * x[:, None] + poly[:, 2] * x[:, None] ** 2)  # [Ng, K]
        # Mixing: each variable a random mix; levels interpolate between two mixes.
        O = self.task.output_channels
        mix = np.zeros((K, O))
        levels = np.asarray(self.task.pressure_levels, np.float64)
        frac = (levels - levels.min()) / max(np.ptp(levels), 1.0)  # [levels]
        col = 0
        for _ in SURFACE_VARIABLES:
            mix[:, col] = rng.normal(0.0, 1.0, K) / np.sqrt(K)
            col += 1
        for _ in ATMOSPHERIC_VARIABLES:
            top, bottom = rng.normal(0.0, 1.0, (2, K)) / np.sqrt(K)
            for f in frac:
                mix[:, col] = (1 - f) * top + f * bottom
                col += 1
        object.__setattr__(self, "_lat", lat_n)
        object.__setattr__(self, "_lon", lon_n)
        object.__setattr__(self, "_m", m)
        object.__setattr__(self, "_envelope", envelope.astype(np.float32))
        object.__setattr__(self, "_omega", rng.uniform(0.05, 0.4, K))  # rad per frame
        object.__setattr__(self, "_phase", rng.uniform(0.0, 2 * np.pi, K))
        object.__setattr__(self, "_mix", mix.astype(np.float32))
        object.__setattr__(self, "_offset", rng.normal(0.0, 2.0, O).astype(np.float32))
        object.__setattr__(self, "_scale", np.exp(rng.normal(0.0, 0.5, O)).astype(np.float32))
        geo = envelope @ rng.normal(0.0, 1.0, K) / np.sqrt(K)  # [Ng]
        statics = np.stack([geo, (geo > np.median(geo)).astype(np.float64)], -1)
        object.__setattr__(self, "_statics", statics.astype(np.float32))  # [Ng, 2]
        object.__setattr__(self, "_norm", None)

    @property
    def num_grid_nodes(self) -> int:
        return self._lat.size

    def frames(self, times) -> np.ndarray:
        """Target variables at frame indices `times` [T] -> [T, Ng, O] float32."""
        t = np.asarray(times, np.float64)[:, None]  # [T, 1]
        angle = (self._m[None, None, :] * self._lon[None, :, None]
                 - self._omega * t[:, :, None] + self._phase)  # [T, Ng, K]
        basis = self._envelope[None] * np.cos(angle).astype(np.float32)  # [T, Ng, K]
        return (basis @ self._mix) * self._scale + self._offset  # [T, Ng, O]

    def forcings(self, times) -> np.ndarray:
        """Forcings at frame indices `times` [T] -> [T, Ng, 5] float32 (raw units)."""
        hours = np.asarray(times, np.float64) * HOURS_PER_FRAME + 1000.0 * self.seed  # [T]
        year = (hours / HOURS_PER_YEAR) % 1.0
        day = (hours / 24.0) % 1.0
        decl = np.deg2rad(23.44) * np.sin(2 * np.pi * year)  # [T]
        hour_angle = 2 * np.pi * day[:, None] + self._lon[None] - np.pi  # [T, Ng]
        cos_zenith = (np.sin(self._lat)[None] * np.sin(decl)[:, None]
                      + np.cos(self._lat)[None] * np.cos(decl)[:, None] * np.cos(hour_angle))
        toa = 1361.0 * np.maximum(cos_zenith, 0.0)  # [T, Ng] W m-2
        ng = self.num_grid_nodes
        cyc = [np.broadcast_to(f(2 * np.pi * p)[:, None], (len(hours), ng))
               for p in (year, day) for f in (np.sin, np.cos)]
        return np.stack([toa] + cyc, -1).astype(np.float32)  # [T, Ng, 5]

    def raw_inputs(self, t0: int) -> np.ndarray:
        """Raw (unnormalised) inputs [Ng, C] for the frame pair (t0 - 1, t0)."""
        v_idx = input_variable_channels(self.task)
        frames = self.frames([t0 - 1, t0])[..., v_idx]  # [2, Ng, V]
        forc = self.forcings([t0 - 1, t0, t0 + 1])  # [3, Ng, 5]
        return np.concatenate([frames[0], frames[1], forc[0], forc[1], forc[2],
                               self._statics], -1)  # [Ng, C]

    def normalization(self) -> Normalization:
        """Channel statistics from a fixed stretch of the synthetic climate (cached)."""
        if self._norm is None:
            times = np.arange(1, STATS_FRAMES + 1) * 7  # spread over weeks
            inputs = np.stack([self.raw_inputs(int(t)) for t in times])  # [T, Ng, C]
            frames = self.frames(np.concatenate([times, times + 1]))  # [2T, Ng, O]
            diffs = frames[len(times):] - frames[:len(times)]  # [T, Ng, O]
            in_mean = inputs.mean((0, 1))
            in_std = inputs.std((0, 1)) + 1e-6
            res_std = diffs.std((0, 1)) + 1e-6
            v_idx = input_variable_channels(self.task)
            var_std = np.ones(self.task.output_channels, np.float32)
            var_std[v_idx] = in_std[len(v_idx):2 * len(v_idx)]  # the newest frame's std
            if not self.task.precipitation_input:
                var_std[~np.isin(np.arange(self.task.output_channels), v_idx)] = 1.0
            norm = Normalization(in_mean.astype(np.float32), in_std.astype(np.float32),
                                 res_std.astype(np.float32),
                                 (res_std / var_std).astype(np.float32))
            object.__setattr__(self, "_norm", norm)
        return self._norm

    def make_batch(self, batch: int, rollout: int = 1, start: int = 1) -> Example:
        """A normalised `Example`: B samples starting 13 frames apart from `start`.

        Returns:
          `Example(inputs [Ng, B, C], targets [T, Ng, B, O], forcings [T, Ng, B, 5])`.
        """
        if batch < 1 or rollout < 1 or start < 1:
            raise ValueError(f"batch={batch}, rollout={rollout} and start={start} must be >= 1")
        norm = self.normalization()
        C = self.task.data_channels
        forc_mean, forc_std = norm.input_mean[C - 7:C - 2], norm.input_std[C - 7:C - 2]
        inputs, targets, forcings = [], [], []
        for b in range(batch):
            t0 = start + 13 * b
            inputs.append((self.raw_inputs(t0) - norm.input_mean) / norm.input_std)
            f = self.frames(np.arange(t0, t0 + rollout + 1))  # [T+1, Ng, O]
            targets.append((f[1:] - f[:-1]) / norm.residual_std)  # [T, Ng, O]
            fc = self.forcings(np.arange(t0 + 2, t0 + rollout + 2))  # [T, Ng, 5]
            forcings.append((fc - forc_mean) / forc_std)
        return Example(np.stack(inputs, 1).astype(np.float32),  # [Ng, B, C]
                       np.stack(targets, 2).astype(np.float32),  # [T, Ng, B, O]
                       np.stack(forcings, 2).astype(np.float32))  # [T, Ng, B, 5]
