"""The pictures of the synthetic person-search world (:mod:`~.persons`): a pedestrian drawn
with numpy as a stack of flat-coloured body parts on a varied background.

A person's clothing attributes fix the colours and shapes of the parts (hair, hat, upper
garment and its sleeves, lower garment, shoes, bag); a :class:`Pose` moves and scales the
figure, turns it (front, back, side; a side view may be mirrored), spreads the legs, shifts the
arms, picks the background (wall and ground colours, the horizon, a pillar) and the lighting
(one gain and one tint per channel applied to the whole picture) and seeds the pixel noise.
So two pictures of one person differ in every pixel statistic except the colours of the
attribute-defined parts, which stay ``clip(rgb * gain + tint)`` up to the noise.

Rendering is pure numpy (no anti-aliasing), so a pose gives the same array on every machine;
:func:`render_person` also returns the part map (:data:`PARTS`), which says which part drew
each pixel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .render import RGB

#: Part labels of the map :func:`render_person` returns (index = label).
PARTS = ("background", "skin", "hair", "hat", "upper", "lower", "shoes", "bag")
_BG, _SKIN, _HAIR, _HAT, _UPPER, _LOWER, _SHOES, _BAG = range(len(PARTS))
#: Views of a :class:`Pose`.
VIEWS = ("front", "back", "side")
#: Skin tones (an uncaptioned trait of a person).
SKIN_RGB = ((236, 196, 164), (198, 146, 106), (120, 80, 56))
#: Hair colours: black, brown, blond, grey.
HAIR_RGB = ((28, 24, 20), (110, 70, 40), (222, 192, 112), (160, 160, 160))
#: Background scenes as (wall, ground) colours: pavement, park, brick street, indoor hall,
#: asphalt, glass front.
BACKGROUNDS = (
    ((176, 176, 170), (140, 140, 136)),
    ((120, 160, 110), (86, 132, 70)),
    ((166, 96, 76), (150, 146, 140)),
    ((218, 208, 188), (186, 170, 150)),
    ((96, 98, 102), (66, 68, 72)),
    ((150, 182, 210), (120, 120, 124)),
)
#: Standard deviation of the pixel noise (every pixel), and the extra noise of the background.
NOISE_STD = 3.0
BACKGROUND_NOISE_STD = 6.0

# Garment shapes (indices into persons.UPPER_TYPES and LOWER_TYPES).
_TSHIRT, _SWEATER, _COAT, _VEST = range(4)
_TROUSERS, _SHORTS, _SKIRT = range(3)
_BACKPACK, _HANDBAG = range(2)


@dataclass(frozen=True)
class Pose:
    """Everything about one picture that is not the person.

    ``view``: index into :data:`VIEWS`; ``mirror``: flip left-right; ``scale``: the figure's
    height over the picture's; ``centre``: its horizontal centre as a fraction of the width;
    ``top``: the fraction of the free height above the figure; ``stride``: the gap between the
    legs (figure heights); ``arm``: the arms' vertical shift (figure heights); ``background``:
    index into :data:`BACKGROUNDS`; ``horizon``: the wall/ground line (fraction of the height);
    ``pillar``: the left edge of a darker vertical band (fraction of the width; negative for
    none); ``gain`` and ``tint``: the lighting, ``out = clip(colour * gain + tint)``;
    ``noise_seed``: the seed of the pixel noise.
    """

    view: int
    mirror: bool
    scale: float
    centre: float
    top: float
    stride: float
    arm: float
    background: int
    horizon: float
    pillar: float
    gain: float
    tint: tuple[float, float, float]
    noise_seed: int

    def to_json(self) -> dict[str, object]:
        """The pose as ``world.json`` records it (the view by name)."""
        out = asdict(self)
        out["view"] = VIEWS[self.view]
        out["tint"] = list(self.tint)
        return out


def sample_pose(rng: np.random.Generator) -> Pose:
    """A random :class:`Pose` (the ranges keep the figure inside the picture)."""
    return Pose(
        view=int(rng.integers(len(VIEWS))),
        mirror=bool(rng.integers(2)),
        scale=round(float(rng.uniform(0.8, 0.95)), 4),
        centre=round(float(rng.uniform(0.42, 0.58)), 4),
        top=round(float(rng.uniform(0.1, 0.9)), 4),
        stride=round(float(rng.uniform(0.0, 0.06)), 4),
        arm=round(float(rng.uniform(-0.02, 0.02)), 4),
        background=int(rng.integers(len(BACKGROUNDS))),
        horizon=round(float(rng.uniform(0.55, 0.8)), 4),
        pillar=round(float(rng.uniform(-0.6, 0.8)), 4),
        gain=round(float(rng.uniform(0.75, 1.2)), 4),
        tint=tuple(round(float(t), 2) for t in rng.uniform(-12, 12, 3)),  # type: ignore[arg-type]
        noise_seed=int(rng.integers(2**31)),
    )


def lit(rgb: tuple[int, ...] | np.ndarray, pose: Pose) -> np.ndarray:
    """``rgb`` under the pose's lighting, before the noise: ``clip(rgb * gain + tint)``."""
    out = np.asarray(rgb, dtype=np.float64) * pose.gain + np.asarray(pose.tint)
    return np.clip(out, 0, 255)


class _Canvas:
    """A colour array and a part map, drawn on in figure coordinates (fractions of the
    figure's height from its top; x from its centre line)."""

    def __init__(self, height: int, width: int, pose: Pose, background: np.ndarray) -> None:
        self.rgb = background
        self.parts = np.zeros((height, width), dtype=np.uint8)
        self.fh = pose.scale * height
        self.y0 = (height - self.fh) * pose.top
        self.cx = pose.centre * width
        self.mirror = pose.mirror
        yy, xx = np.mgrid[0:height, 0:width]
        self.fy = (yy + 0.5 - self.y0) / self.fh  # figure coordinates of the pixel centres
        fx = (xx + 0.5 - self.cx) / self.fh
        self.fx = -fx if pose.mirror else fx

    def paint(self, mask: np.ndarray, part: int, rgb: tuple[int, ...]) -> None:
        self.rgb[mask] = rgb
        self.parts[mask] = part

    def rect(self, y0: float, y1: float, x0: float, x1: float) -> np.ndarray:
        return (self.fy >= y0) & (self.fy < y1) & (self.fx >= x0) & (self.fx < x1)

    def ellipse(self, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
        return ((self.fy - cy) / ry) ** 2 + ((self.fx - cx) / rx) ** 2 <= 1.0

    def trapezoid(self, y0: float, y1: float, half0: float, half1: float) -> np.ndarray:
        t = (self.fy - y0) / (y1 - y0)
        half = half0 + (half1 - half0) * t
        return (t >= 0) & (t < 1) & (np.abs(self.fx) < half)


def _background(height: int, width: int, pose: Pose, rng: np.random.Generator) -> np.ndarray:
    wall, ground = (np.asarray(c, dtype=np.float64) for c in BACKGROUNDS[pose.background])
    rows = np.arange(height)[:, None, None]
    shade = 1.0 - 0.15 * rows / height  # walls darken downwards, a cue of depth
    out = np.where(rows < pose.horizon * height, wall * shade, ground * (1.1 - 0.2 * shade))
    out = np.broadcast_to(out, (height, width, 3)).copy()
    if pose.pillar >= 0:
        x0 = int(pose.pillar * width)
        out[:, x0 : x0 + max(2, width // 6)] *= 0.7
    return out + rng.normal(0.0, BACKGROUND_NOISE_STD, out.shape)


def render_person(
    person: dict[str, int], pose: Pose, *, height: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``person`` (field -> value index, as :class:`~.persons.PersonsWorld` records it) in
    ``pose``; returns the ``(height, width, 3)`` ``uint8`` picture and the ``(height, width)``
    part map (labels of :data:`PARTS`).

    Parts are drawn back to front: a backpack seen from the front or side, the legs and lower
    garment, the shoes, the torso, the arms, the head and neck, the hair, the hat, then a
    backpack seen from behind (over the torso and hair) or a handbag (in front of the hip).
    """
    rng = np.random.default_rng(pose.noise_seed)
    c = _Canvas(height, width, pose, _background(height, width, pose, rng))
    view = VIEWS[pose.view]
    skin = SKIN_RGB[person["skin"]]
    upper, lower = RGB[person["upper_colour"]], RGB[person["lower_colour"]]
    upper_type, lower_type = person["upper_type"], person["lower_type"]
    half = 0.065 if view == "side" else 0.1  # half the torso's width
    bag = person["bag_type"]
    bag_rgb = RGB[person["bag_colour"]] if bag >= 0 else (0, 0, 0)
    if bag == _BACKPACK and view == "side":  # behind the back
        c.paint(c.rect(0.19, 0.41, -half - 0.075, -half + 0.01), _BAG, bag_rgb)
    # legs and the lower garment
    gap = 0.012 + pose.stride / 2
    legs = c.rect(0.46, 0.93, -gap - 0.075, -gap) | c.rect(0.46, 0.93, gap, gap + 0.075)
    hips = c.rect(0.46, 0.53, -gap - 0.075, gap + 0.075)
    if lower_type == _TROUSERS:
        c.paint(legs | hips, _LOWER, lower)
    else:
        c.paint(legs, _SKIN, skin)
        if lower_type == _SHORTS:
            c.paint(hips | (legs & (c.fy < 0.62)), _LOWER, lower)
        else:  # skirt: a flared trapezoid over the thighs
            c.paint(c.trapezoid(0.46, 0.69, half, half * 1.45 + gap / 2), _LOWER, lower)
    shoes = c.rect(0.93, 0.985, -gap - 0.08, -gap + 0.01) | c.rect(
        0.93, 0.985, gap - 0.01, gap + 0.08
    )
    c.paint(shoes, _SHOES, RGB[person["shoes_colour"]])
    # torso and arms
    bottom = 0.62 if upper_type == _COAT else 0.47
    c.paint(c.rect(0.165, bottom, -half, half), _UPPER, upper)
    if view == "side":  # one arm, swinging in front of the torso
        arms = [c.rect(0.18 + pose.arm, 0.47 + pose.arm, -0.03, 0.03)]
    else:
        arms = [
            c.rect(0.17 + pose.arm, 0.46 + pose.arm, -half - 0.05, -half),
            c.rect(0.17 - pose.arm, 0.46 - pose.arm, half, half + 0.05),
        ]
    for arm in arms:
        top = float(c.fy[arm].min()) if arm.any() else 0.0
        sleeve = {_TSHIRT: 0.1, _VEST: 0.0}.get(upper_type, 1.0)
        c.paint(arm, _SKIN, skin)
        c.paint(arm & (c.fy < top + sleeve), _UPPER, upper)
        c.paint(arm & (c.fy >= top + 0.27), _SKIN, skin)  # the hand, below any sleeve
    # neck, head, hair, hat
    c.paint(c.rect(0.135, 0.17, -0.025, 0.025), _SKIN, skin)
    head = c.ellipse(0.085, 0.0, 0.065, 0.052)
    hair_rgb = HAIR_RGB[person["hair_colour"]]
    long_hair = person["hair_length"] == 1
    if long_hair and view != "back":  # falling beside the face onto the shoulders
        sides = c.rect(0.06, 0.24, -0.064, -0.032) | c.rect(0.06, 0.24, 0.032, 0.064)
        c.paint(sides & ~head, _HAIR, hair_rgb)
    c.paint(head, _SKIN, skin)
    if view == "back":
        c.paint(head, _HAIR, hair_rgb)
        if long_hair:
            c.paint(c.rect(0.085, 0.26, -0.058, 0.058), _HAIR, hair_rgb)
    else:
        c.paint(head & (c.fy < 0.055 if view == "front" else c.fy < 0.07), _HAIR, hair_rgb)
        if view == "side":
            c.paint(head & (c.fx < -0.02), _HAIR, hair_rgb)
    if person["hat_colour"] >= 0:
        hat = c.rect(0.0, 0.045, -0.058, 0.058) | c.rect(0.035, 0.05, -0.08, 0.08)
        c.paint(hat, _HAT, RGB[person["hat_colour"]])
    if bag == _BACKPACK and view == "back":
        c.paint(c.rect(0.2, 0.42, -0.075, 0.075), _BAG, bag_rgb)
    elif bag == _BACKPACK and view == "front":  # only the straps show
        straps = c.rect(0.17, 0.34, -0.06, -0.04) | c.rect(0.17, 0.34, 0.04, 0.06)
        c.paint(straps, _BAG, bag_rgb)
    elif bag == _HANDBAG:
        c.paint(c.rect(0.4, 0.52, half - 0.02, half + 0.075), _BAG, bag_rgb)
    # lighting, then the camera's noise
    out = c.rgb * pose.gain + np.asarray(pose.tint)
    out = out + rng.normal(0.0, NOISE_STD, out.shape)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8), c.parts


__all__ = [
    "BACKGROUNDS",
    "HAIR_RGB",
    "PARTS",
    "SKIN_RGB",
    "VIEWS",
    "Pose",
    "lit",
    "render_person",
    "sample_pose",
]
