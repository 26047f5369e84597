"""Synthetic weather: seeded, smooth fields on the sphere with the task's channel layout.

No data can be downloaded here, so training and measurement run on synthetic weather of
realistic shapes and units. Every variable is a climatological value plus a spread times an
anomaly, and every anomaly mixes the same K travelling basis fields

    b_k(lat, lon, t) = cos(lat)^m_k P_k(sin lat) cos(m_k lon - w_k t + phase_k) / rms_k,

with zonal wavenumber m_k in 0..4 and P_k a quadratic. The factor cos(lat)^m_k makes each
field continuous at the poles (every longitude of a pole row gets the same value when
m_k > 0), the low degrees make it smooth, and the phases drift by w_k radians per 6-hour
frame, so consecutive frames are correlated and the residual to the next frame is a
learnable function of the state. Atmospheric variables mix the basis smoothly in
log-pressure, so a level means the same thing in every task. Precipitation and specific
humidity are kept positive by a softplus.

Everything is a function of the seed and of (lat, lon, time, channel) only: the same seed
gives the same values at the same points whatever the resolution or level set. Forcings
follow their real definitions (top-of-atmosphere solar radiation from the solar declination
and hour angle, accumulated over the hour ending at the frame; year progress and local day
progress as sin/cos); statics are a surface geopotential (zero over sea) and a land-sea mask.
Frame t is `EPOCH_HOURS + 6 t` hours after 1970-01-01T00 UTC.

Input channel order (`TaskConfig.data_channels`, C in all): frame t-1 variables (V), frame t
variables (V), forcings of frames t-1, t and t+1 (3 x 5), statics (2). The V input variables
are `task.target_channel_names` in order, without precipitation when
`task.precipitation_input` is False.

Shapes: T frames or rollout steps, Ng grid nodes, B batch, O target channels, V input
variables per frame, C data channels, K basis fields.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import numpy as np

from gclab.config import (
    ATMOSPHERIC_VARIABLES,
    MAX_INT32,
    NUM_FORCINGS,
    NUM_STATICS,
    SURFACE_VARIABLES,
    ModelConfig,
    TaskConfig,
    is_int,
    require_kind,
)
from gclab.limits import host_memory_bytes, require_fits
from gclab.training.examples import Example, input_variable_channels, residual_channels

HOURS_PER_FRAME = 6.0
EPOCH_HOURS = 16801 * 24.0  # 2016-01-01T00 UTC in hours since 1970-01-01T00 UTC
DAYS_PER_YEAR = 365.24219
SOLAR_CONSTANT = 1361.0  # W m-2
GRAVITY = 9.80665  # m s-2
SAMPLE_SPACING = 13  # frames between the samples of a batch (odd: they differ in hour)
STATS_SAMPLES = 48  # frame pairs behind `Normalization`
STATS_SPACING = 31  # frames between them (31 x 6 h: every 6 h of day, about a year)
STATS_MAX_NODES = 4096  # nodes sampled for the statistics of a large grid
MAX_WAVENUMBER = 4
LAND_THRESHOLD = 0.55  # land where the land anomaly exceeds this (about 29% of the globe)


class RawExample(NamedTuple):
    """One batch in physical units (what `Normalization.normalise` turns into an `Example`).

    Attributes:
      inputs: [Ng, B, C] inputs of the first step (channel order in the module docstring).
      last_frame: [Ng, B, O] all target variables at frame t (the last input frame).
      targets: [T, Ng, B, O] target frames t+1 .. t+T.
      forcings: [T, Ng, B, 5] forcings of frames t+2 .. t+T+1 (step k+1 of a rollout needs
        frame t+k+1's; the last row is never used).
    """

    inputs: np.ndarray
    last_frame: np.ndarray
    targets: np.ndarray
    forcings: np.ndarray


class Normalization(NamedTuple):
    """Channel statistics that turn physical values into normalised units.

    Inputs are normalised per channel. Targets of variables that are also inputs become
    residuals against the last input frame over `residual_std` (the std of the 6-hour
    change); a target that is not an input (precipitation when it is not an input) is
    normalised directly with `target_mean` / `target_std`, as in the official code.

    Attributes:
      input_mean: [C] mean of each input channel.
      input_std: [C] std of each input channel.
      target_mean: [O] mean of each target variable.
      target_std: [O] std of each target variable.
      residual_std: [O] std of each target variable's 6-hour change.
      residual_scale: [O] residual_std / target_std: turns a normalised residual into
        normalised input units (what the rollout adds to the newest input frame).
      is_residual: [O] bool, True where the target is a residual (the variable is an input).
    """

    input_mean: np.ndarray
    input_std: np.ndarray
    target_mean: np.ndarray
    target_std: np.ndarray
    residual_std: np.ndarray
    residual_scale: np.ndarray
    is_residual: np.ndarray

    def normalise_inputs(self, inputs: np.ndarray) -> np.ndarray:
        """Physical inputs [..., C] -> normalised inputs [..., C] float32."""
        return ((inputs - self.input_mean) / self.input_std).astype(np.float32)

    def normalise_targets(self, targets: np.ndarray, last_frame: np.ndarray) -> np.ndarray:
        """Target frames [T, ..., O] and the last input frame [..., O] -> normalised targets.

        Step k's target is (frame t+k - frame t) / residual_std for residual channels: the
        sum of the true residuals of steps 1..k, which a rollout compares with the sum of
        its predicted residuals (the error of the predicted state, as in the official
        rollout loss). Other channels: (frame t+k - target_mean) / target_std.
        """
        residual = (targets - last_frame[None]) / self.residual_std  # [T, ..., O]
        direct = (targets - self.target_mean) / self.target_std  # [T, ..., O]
        return np.where(self.is_residual, residual, direct).astype(np.float32)

    def denormalise_targets(self, targets: np.ndarray, last_frame: np.ndarray) -> np.ndarray:
        """The inverse of `normalise_targets`: normalised targets -> physical frames."""
        residual = last_frame[None] + targets * self.residual_std  # [T, ..., O]
        direct = self.target_mean + targets * self.target_std  # [T, ..., O]
        return np.where(self.is_residual, residual, direct)

    def normalise(self, raw: RawExample) -> Example:
        """A `RawExample` in physical units -> the normalised `Example` training uses."""
        C = self.input_mean.size
        forcing = slice(C - NUM_STATICS - NUM_FORCINGS, C - NUM_STATICS)  # newest forcings
        forcings = (raw.forcings - self.input_mean[forcing]) / self.input_std[forcing]
        return Example(self.normalise_inputs(raw.inputs),  # [Ng, B, C]
                       self.normalise_targets(raw.targets, raw.last_frame),  # [T, Ng, B, O]
                       forcings.astype(np.float32))  # [T, Ng, B, 5]


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _latitude_profile(lat: np.ndarray, wavenumber: np.ndarray, poly: np.ndarray
                      ) -> np.ndarray:
    """cos(lat)^m_k P_k(sin lat): [N] latitudes (radians) -> [N, K]."""
    x = np.sin(lat)[:, None]  # [N, 1]
    p = poly[:, 0] + poly[:, 1] * x + poly[:, 2] * x ** 2  # [N, K]
    return np.abs(np.cos(lat))[:, None] ** wavenumber * p


def _climatology(task: TaskConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean [O], spread [O], positive [O]) of each target channel, roughly as on Earth."""
    mean, spread, positive = [], [], []
    surface = {  # name: (mean, spread, positive)
        "2m_temperature": (288.0, 12.0, False),  # K
        "mean_sea_level_pressure": (101325.0, 1000.0, False),  # Pa
        "10m_u_component_of_wind": (0.0, 5.0, False),  # m s-1
        "10m_v_component_of_wind": (0.0, 4.0, False),  # m s-1
        "total_precipitation_6hr": (0.0, 1e-3, True),  # m
    }
    for name in SURFACE_VARIABLES:
        m, s, p = surface[name]
        mean.append(m)
        spread.append(s)
        positive.append(p)
    for name in ATMOSPHERIC_VARIABLES:
        for level in task.pressure_levels:
            height = 7000.0 * math.log(1013.25 / level)  # m, an isothermal scale height
            m, s, p = {
                "temperature": (max(288.0 - 6.5e-3 * height, 216.65), 8.0, False),  # K
                "geopotential": (GRAVITY * height, GRAVITY * (40.0 + 8e-3 * height), False),
                "u_component_of_wind": (2.0 + 10.0 * (1.0 - level / 1013.25),
                                        6.0 + 10.0 * (1.0 - level / 1013.25), False),
                "v_component_of_wind": (0.0, 6.0, False),
                "vertical_velocity": (0.0, 0.15, False),  # Pa s-1
                "specific_humidity": (0.0, 0.012 * (level / 1000.0) ** 3 + 2e-6, True),
            }[name]
            mean.append(m)
            spread.append(s)
            positive.append(p)
    return (np.asarray(mean), np.asarray(spread), np.asarray(positive))


def _unit_envelope(lat: np.ndarray, wavenumber: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Latitude profiles [Ng, K] of the basis fields, each scaled to unit mean square over the
    sphere (on a fixed grid, so the scale does not depend on the resolution asked for)."""
    ref = np.deg2rad(np.linspace(-90.0, 90.0, 721))
    ref_env = _latitude_profile(ref, wavenumber, poly)  # [721, K]
    zonal_mean_sq = np.where(wavenumber > 0, 0.5, 1.0)  # mean of cos^2 over longitude
    area = np.cos(ref)[:, None]
    rms = np.sqrt((ref_env ** 2 * area).sum(0) / area.sum() * zonal_mean_sq)  # [K]
    return _latitude_profile(lat, wavenumber, poly) / rms  # [Ng, K]


def _channel_mix(task: TaskConfig, surface_mix: np.ndarray, atmos_mix: np.ndarray
                 ) -> np.ndarray:
    """Mixing weights [K, O] of each target channel; levels blend two mixes in log pressure."""
    K = surface_mix.shape[1]
    mix = np.zeros((K, task.output_channels))
    mix[:, :len(SURFACE_VARIABLES)] = surface_mix.T
    frac = np.log(np.asarray(task.pressure_levels, np.float64)) / np.log(1000.0)
    col = len(SURFACE_VARIABLES)
    for top, bottom in atmos_mix:
        for f in frac:
            blend = (1 - f) * top + f * bottom  # [K]
            mix[:, col] = blend / np.sqrt((1 - f) ** 2 + f ** 2)  # unit variance
            col += 1
    return mix


def _statics(still: np.ndarray, static_mix: np.ndarray) -> np.ndarray:
    """Geopotential at the surface and land-sea mask [Ng, 2] from the basis at t = 0 [Ng, K]:
    a land anomaly frozen in time; orography rises from the coast inland."""
    land, relief = np.einsum("nk,sk->sn", still, static_mix)  # [Ng] each
    mask = (land > LAND_THRESHOLD).astype(np.float64)  # [Ng]
    height = 2500.0 * np.maximum(land - LAND_THRESHOLD, 0.0) ** 1.5 * _softplus(relief)
    return np.stack([GRAVITY * height, mask], -1)  # [Ng, 2]


class SyntheticWeather:
    """Seeded synthetic weather for a task on a pole-inclusive lat/lon grid.

    Every value is a function of the seed and of position, time and channel: K travelling
    basis fields (a latitude profile times a zonal wave moving at its own speed) mixed per
    variable and level, around a per-channel climatology in physical units.

    Args:
      task: channel layout (pressure levels, whether precipitation is an input).
      resolution: grid spacing in degrees (divides 180); grid nodes are latitude-major.
      seed: an integer >= 0.
      basis: number K of travelling basis fields mixed into each variable.

    Attributes:
      grid_lat: [n_lat] degrees, and `grid_lon` [n_lon] degrees: the grid of
        `gclab.geometry.build_graphs` at this resolution.

    Raises:
      ValueError: an invalid task, resolution, seed or basis (the message names the field).
      gclab.limits.TooLarge: the fields would not fit in this machine's memory.
    """

    def __init__(self, task: TaskConfig, resolution: float, seed: int = 0,
                 basis: int = 24) -> None:
        require_kind("SyntheticWeather.task", task, TaskConfig)
        try:
            model = ModelConfig(resolution=resolution)
        except ValueError as e:
            raise ValueError(str(e).replace("ModelConfig.", "SyntheticWeather.")) from None
        if not is_int(basis) or not 1 <= basis <= 4096:
            raise ValueError(f"SyntheticWeather.basis={basis!r} is invalid: an integer in "
                             "1..4096.")
        if not is_int(seed) or seed < 0:
            raise ValueError(f"SyntheticWeather.seed={seed!r} is invalid: an integer >= 0.")
        # float64 [Ng, K] envelope and its t = 0 field, [Ng] coordinates, [Ng, 2] statics.
        require_fits(f"synthetic weather on a {resolution:g} deg grid "
                     f"({model.num_grid_nodes:,} nodes) with {basis} basis fields",
                     8 * model.num_grid_nodes * (3 * basis + 8), host_memory_bytes(),
                     "this machine's memory")
        basis, seed = int(basis), int(seed)
        self.task, self.resolution, self.seed, self.basis = task, resolution, seed, basis
        lat = np.deg2rad(np.linspace(-90.0, 90.0, model.n_lat))  # [n_lat]
        lon = np.deg2rad(np.arange(model.n_lon) * resolution)  # [n_lon]
        self.grid_lat, self.grid_lon = np.rad2deg(lat), np.rad2deg(lon)
        self._lat = np.repeat(lat, model.n_lon)  # [Ng]
        self._lon = np.tile(lon, model.n_lat)  # [Ng]
        # All random draws, in a fixed order that does not depend on task or resolution.
        rng = np.random.default_rng(seed)
        K = basis
        wavenumber = rng.integers(0, MAX_WAVENUMBER + 1, K)  # [K]
        poly = rng.normal(0.0, 1.0, (K, 3))  # P_k(x) = c0 + c1 x + c2 x^2
        self._speed = rng.uniform(0.05, 0.35, K) * rng.choice([-1.0, 1.0], K)  # rad per frame
        self._phase = rng.uniform(0.0, 2 * np.pi, K)  # [K]
        surface_mix = rng.normal(0.0, 1.0, (len(SURFACE_VARIABLES), K)) / np.sqrt(K)
        atmos_mix = rng.normal(0.0, 1.0, (len(ATMOSPHERIC_VARIABLES), 2, K)) / np.sqrt(K)
        static_mix = rng.normal(0.0, 1.0, (2, K)) / np.sqrt(K)  # land, orography
        self._wavenumber = wavenumber
        self._envelope = _unit_envelope(self._lat, wavenumber, poly)  # [Ng, K]
        self._mix = _channel_mix(task, surface_mix, atmos_mix)  # [K, O]
        self._clim_mean, self._clim_spread, self._positive = _climatology(task)
        still = self._envelope * np.cos(wavenumber * self._lon[:, None] + self._phase)
        self._statics = _statics(still, static_mix)  # [Ng, 2]

    def __repr__(self) -> str:
        return (f"SyntheticWeather({self.task.num_levels} levels, {self.resolution:g} deg, "
                f"seed={self.seed}, basis={self.basis})")

    @property
    def num_grid_nodes(self) -> int:
        """Ng."""
        return self._lat.size

    @property
    def statics(self) -> np.ndarray:
        """[Ng, 2]: geopotential at the surface (m2 s-2, 0 over sea), land-sea mask (0/1)."""
        return self._statics.astype(np.float32)

    def anomalies(self, times: Sequence[float], nodes=slice(None)) -> np.ndarray:
        """Unit-scale anomalies [T, Ng, O] (float64) at frame indices `times`."""
        t = np.asarray(times, np.float64)  # [T]
        angle = (self._wavenumber * self._lon[nodes, None]
                 - self._speed * t[:, None, None] + self._phase)  # [T, Ng, K]
        basis = self._envelope[nodes] * np.cos(angle)  # [T, Ng, K]
        # einsum, not BLAS: the same sums in the same order on every machine.
        return np.einsum("tnk,ko->tno", basis, self._mix)  # [T, Ng, O]

    def frames(self, times: Sequence[float], nodes=slice(None)) -> np.ndarray:
        """Target variables at frame indices `times` [T] -> [T, Ng, O] float32 (physical).

        Channels in `task.target_channel_names` order (the trajectory of every variable).
        """
        a = self.anomalies(times, nodes)  # [T, Ng, O]
        out = self._clim_mean + self._clim_spread * a  # [T, Ng, O]
        pos = self._positive
        out[..., pos] = self._clim_spread[pos] * _softplus(1.5 * a[..., pos] - 1.0)
        return out.astype(np.float32)  # [T, Ng, O]

    def trajectory(self, length: int, start: int = 0) -> np.ndarray:
        """`length` consecutive frames from `start`: [T, Ng, O] float32."""
        return self.frames(np.arange(start, start + length))

    def forcings(self, times: Sequence[float], nodes=slice(None)) -> np.ndarray:
        """Forcings at frame indices `times` [T] -> [T, Ng, 5] float32, physical units.

        Channels: top-of-atmosphere incident solar radiation (J m-2 over the hour ending at
        the frame), year progress sin/cos (global), day progress sin/cos (local solar
        time: UTC plus longitude, as in the official code).
        """
        hours = EPOCH_HOURS + np.asarray(times, np.float64) * HOURS_PER_FRAME  # [T]
        lat, lon = self._lat[nodes], self._lon[nodes]  # [Ng]
        toa = np.zeros((hours.size, lat.size))
        for minute in np.arange(5.0, 60.0, 10.0):  # six samples across the hour
            h = hours - 1.0 + minute / 60.0  # [T]
            year = (h / 24.0 / DAYS_PER_YEAR) % 1.0  # [T]
            orbit = 2 * np.pi * year
            declination = np.deg2rad(-23.44) * np.cos(orbit + 2 * np.pi * 10 / DAYS_PER_YEAR)
            distance = 1.0 + 0.0334 * np.cos(orbit - 2 * np.pi * 3 / DAYS_PER_YEAR)
            hour_angle = 2 * np.pi * (h[:, None] / 24.0 % 1.0) + lon[None] - np.pi  # [T, Ng]
            cos_zenith = (np.sin(lat)[None] * np.sin(declination)[:, None]
                          + np.cos(lat)[None] * np.cos(declination)[:, None]
                          * np.cos(hour_angle))  # [T, Ng]
            toa += SOLAR_CONSTANT * distance[:, None] * np.maximum(cos_zenith, 0.0) * 600.0
        year = (hours / 24.0 / DAYS_PER_YEAR) % 1.0  # [T]
        day = (hours[:, None] / 24.0 + lon[None] / (2 * np.pi)) % 1.0  # [T, Ng]
        year = np.broadcast_to(year[:, None], day.shape)  # [T, Ng]
        return np.stack([toa, np.sin(2 * np.pi * year), np.cos(2 * np.pi * year),
                         np.sin(2 * np.pi * day), np.cos(2 * np.pi * day)],
                        -1).astype(np.float32)  # [T, Ng, 5]

    def raw_inputs(self, t0: int, nodes=slice(None)) -> np.ndarray:
        """Physical inputs [Ng, C] of the frame pair (t0 - 1, t0)."""
        v_idx = input_variable_channels(self.task)
        frames = self.frames([t0 - 1, t0], nodes)[..., v_idx]  # [2, Ng, V]
        forc = self.forcings([t0 - 1, t0, t0 + 1], nodes)  # [3, Ng, 5]
        return np.concatenate([frames[0], frames[1], forc[0], forc[1], forc[2],
                               self.statics[nodes]], -1)  # [Ng, C]

    def normalization(self) -> Normalization:
        """Channel statistics of a long stretch of the synthetic climate (cached).

        `STATS_SAMPLES` frame pairs `STATS_SPACING` frames apart (about a year, every hour
        of the day), on at most `STATS_MAX_NODES` grid nodes.
        """
        return self._normalization

    @functools.cached_property
    def _normalization(self) -> Normalization:
        nodes = slice(None, None, max(1, -(-self.num_grid_nodes // STATS_MAX_NODES)))
        times = 1 + STATS_SPACING * np.arange(STATS_SAMPLES)  # [S]
        sums = np.zeros((3, 3, self.task.output_channels))  # (frames, diffs, -) x moments
        forcing_sums = np.zeros((3, NUM_FORCINGS))
        for chunk in np.array_split(times, max(1, STATS_SAMPLES // 8)):
            pair = self.frames(np.concatenate([chunk, chunk + 1]), nodes).astype(np.float64)
            now, diff = pair[:len(chunk)], pair[len(chunk):] - pair[:len(chunk)]
            forc = self.forcings(chunk, nodes).astype(np.float64)  # [S', Ng', 5]
            for i, x in enumerate((now, diff)):
                sums[i] += [np.ones_like(x).sum((0, 1)), x.sum((0, 1)), (x ** 2).sum((0, 1))]
            forcing_sums += [np.full(NUM_FORCINGS, forc[..., 0].size), forc.sum((0, 1)),
                             (forc ** 2).sum((0, 1))]

        def mean_std(s):
            mean = s[1] / s[0]
            return mean, np.sqrt(np.maximum(s[2] / s[0] - mean ** 2, 0.0)) + 1e-12

        target_mean, target_std = mean_std(sums[0])
        _, residual_std = mean_std(sums[1])  # std about the mean change
        forcing_mean, forcing_std = mean_std(forcing_sums)
        statics = self._statics[nodes]
        static_mean, static_std = statics.mean(0), statics.std(0) + 1e-12
        v_idx = input_variable_channels(self.task)
        input_mean = np.concatenate([target_mean[v_idx]] * 2 + [forcing_mean] * 3
                                    + [static_mean])  # [C]
        input_std = np.concatenate([target_std[v_idx]] * 2 + [forcing_std] * 3
                                   + [static_std])  # [C]
        is_residual = residual_channels(self.task)
        f32 = np.float32
        return Normalization(input_mean.astype(f32), input_std.astype(f32),
                             target_mean.astype(f32), target_std.astype(f32),
                             residual_std.astype(f32), (residual_std / target_std).astype(f32),
                             is_residual)

    def raw_batch(self, batch: int, rollout: int = 1, start: int = 1) -> RawExample:
        """A `RawExample` (physical units): B samples `SAMPLE_SPACING` frames apart.

        Sample b's last input frame is t = start + SAMPLE_SPACING * b (its first input frame
        is t - 1, so `start` >= 1).
        """
        for name, v in (("batch", batch), ("rollout", rollout), ("start", start)):
            if not is_int(v) or not 1 <= v <= MAX_INT32:
                raise ValueError(f"make_batch {name}={v!r} is invalid: an integer >= 1 "
                                 f"(and <= {MAX_INT32}).")
        ng, k, o = self.num_grid_nodes, self.basis, self.task.output_channels
        frames = rollout + 2  # frames of one sample, float64 [T, Ng, K] basis and angles
        require_fits(f"a batch of {batch} x {rollout} steps of synthetic weather on "
                     f"{ng:,} grid nodes",
                     8 * ng * (frames * (2 * k + 3 * o + 10) + 2 * batch * frames * (o + 5)),
                     host_memory_bytes(), "this machine's memory")
        inputs, last, targets, forcings = [], [], [], []
        for b in range(batch):
            t0 = start + SAMPLE_SPACING * b
            frames = self.frames(np.arange(t0, t0 + rollout + 1))  # [T+1, Ng, O]
            inputs.append(self.raw_inputs(t0))  # [Ng, C]
            last.append(frames[0])  # [Ng, O]
            targets.append(frames[1:])  # [T, Ng, O]
            forcings.append(self.forcings(np.arange(t0 + 2, t0 + rollout + 2)))  # [T, Ng, 5]
        return RawExample(np.stack(inputs, 1),  # [Ng, B, C]
                          np.stack(last, 1),  # [Ng, B, O]
                          np.stack(targets, 2),  # [T, Ng, B, O]
                          np.stack(forcings, 2))  # [T, Ng, B, 5]

    def make_batch(self, batch: int, rollout: int = 1, start: int = 1) -> Example:
        """A normalised `Example` (see `raw_batch` for the samples, `Normalization` for units).

        Returns:
          `Example(inputs [Ng, B, C], targets [T, Ng, B, O], forcings [T, Ng, B, 5])`,
          float32.
        """
        return self.normalization().normalise(self.raw_batch(batch, rollout, start))
