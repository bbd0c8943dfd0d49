"""Small rendered pictures of synthetic scenes (for the Karpathy format; needs Pillow).

Each object is drawn in its cell of a 3 x 3 grid as a 2-D shape of its category, scaled by its
size, repeated ``count`` times, filled with its colour and a texture for its material (metal: a
highlight gradient, rubber: flat, wood: stripes, glass: translucent, stone: speckles). The
pictures are a stand-in for end-to-end encoders (CLIP-style fine-tuning), not photographs.
"""

from __future__ import annotations

import math

import numpy as np

RGB = (
    (200, 30, 30),
    (30, 60, 200),
    (40, 160, 40),
    (230, 210, 40),
    (245, 245, 245),
    (20, 20, 20),
    (240, 140, 180),
    (130, 40, 160),
    (120, 75, 35),
    (128, 128, 128),
)
_BACKGROUND = (200, 196, 188)


def _ngon(cx: float, cy: float, r: float, n: int, rot: float = -math.pi / 2) -> list:
    return [
        (cx + r * math.cos(rot + 2 * math.pi * k / n), cy + r * math.sin(rot + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _star(cx: float, cy: float, r: float) -> list:
    pts = []
    for k in range(10):
        rr = r if k % 2 == 0 else r * 0.45
        a = -math.pi / 2 + math.pi * k / 5
        pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return pts


def _quad(cx: float, cy: float, top: float, bottom: float, up: float, down: float) -> list:
    """A trapezoid with half-widths ``top`` and ``bottom``, ``up`` above and ``down`` below."""
    return [
        (cx - top, cy - up),
        (cx + top, cy - up),
        (cx + bottom, cy + down),
        (cx - bottom, cy + down),
    ]


def _shape(draw, category: int, cx: float, cy: float, r: float) -> None:
    """Draw shape ``category`` filled with 255 on a mask."""
    box = (cx - r, cy - r, cx + r, cy + r)
    w = max(1, int(r / 3))
    poly = {
        0: lambda: _ngon(cx, cy, r * 1.2, 4, math.pi / 4),
        2: lambda: _ngon(cx, cy, r * 1.1, 3),
        3: lambda: _ngon(cx, cy, r, 5),
        4: lambda: _ngon(cx, cy, r, 6),
        5: lambda: _star(cx, cy, r * 1.1),
        7: lambda: [
            (cx - r / 3, cy - r), (cx + r / 3, cy - r), (cx + r / 3, cy - r / 3),
            (cx + r, cy - r / 3), (cx + r, cy + r / 3), (cx + r / 3, cy + r / 3),
            (cx + r / 3, cy + r), (cx - r / 3, cy + r), (cx - r / 3, cy + r / 3),
            (cx - r, cy + r / 3), (cx - r, cy - r / 3), (cx - r / 3, cy - r / 3),
        ],  # fmt: skip
        8: lambda: [(cx, cy - r), (cx + r * 0.6, cy), (cx, cy + r), (cx - r * 0.6, cy)],
        10: lambda: [
            (cx - r, cy - r / 4), (cx, cy - r / 4), (cx, cy - r * 0.7), (cx + r, cy),
            (cx, cy + r * 0.7), (cx, cy + r / 4), (cx - r, cy + r / 4),
        ],  # fmt: skip
        12: lambda: _quad(cx, cy, r, r, r / 4, r / 4),
        15: lambda: _quad(cx, cy, r / 2, r, r / 2, r / 2),
        16: lambda: _ngon(cx, cy, r, 8, math.pi / 8),
        17: lambda: [
            (cx, cy - r), (cx + r * 0.6, cy - r / 4), (cx, cy + r), (cx - r * 0.6, cy - r / 4),
        ],  # fmt: skip
        18: lambda: [(cx - r, cy - r), (cx + r, cy - r), (cx - r, cy + r), (cx + r, cy + r)],
    }  # fmt: skip
    if category in poly:
        draw.polygon(poly[category](), fill=255)
    elif category == 1:
        draw.ellipse(box, fill=255)
    elif category == 6:
        draw.ellipse(box, outline=255, width=w)
    elif category == 9:
        draw.ellipse((cx - r, cy - r * 0.8, cx, cy + r * 0.1), fill=255)
        draw.ellipse((cx, cy - r * 0.8, cx + r, cy + r * 0.1), fill=255)
        draw.polygon([(cx - r, cy - r * 0.3), (cx + r, cy - r * 0.3), (cx, cy + r)], fill=255)
    elif category == 11:
        draw.ellipse(box, fill=255)
        draw.ellipse((cx - r * 0.4, cy - r, cx + r * 1.6, cy + r), fill=0)
    elif category == 13:
        draw.ellipse((cx - r * 0.65, cy - r, cx + r * 0.65, cy + r), fill=255)
    elif category == 14:
        draw.pieslice((cx - r, cy - r / 2, cx + r, cy + r * 1.5), 180, 360, fill=255)
    elif category == 19:
        draw.rectangle(box, outline=255, width=w)
    else:  # pragma: no cover - every category has a branch
        raise ValueError(f"no drawing for category {category}")


def _texture(material: int, colour: int, size: int, rng: np.random.Generator) -> np.ndarray:
    base = np.array(RGB[colour], dtype=np.float32)
    tex = np.broadcast_to(base, (size, size, 3)).copy()
    if material == 0:  # metal: a bright gradient
        ramp = np.linspace(1.35, 0.75, size, dtype=np.float32)[:, None, None]
        tex = tex * ramp + 25
    elif material == 2:  # wood: dark stripes
        tex[::3] *= 0.6
    elif material == 4:  # stone: speckles
        tex *= rng.uniform(0.65, 1.05, (size, size, 1)).astype(np.float32)
    return np.clip(tex, 0, 255).astype(np.uint8)


def render_scene(scene, *, size: int = 64, seed: int = 0):
    """A ``size x size`` RGB ``PIL.Image`` of ``scene`` (objects as in
    :mod:`vlret.worlds.language`)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    bg = np.array(_BACKGROUND, dtype=np.float32) + rng.normal(0, 6, (size, size, 3))
    canvas = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")
    cell = size / 3
    for obj in scene:
        category, count, colour, obj_size, material, pos = obj
        row, col = divmod(int(pos), 3)
        cx, cy = (col + 0.5) * cell, (row + 0.5) * cell
        r = cell / 2 * (0.45, 0.65, 0.85)[obj_size]
        if count > 1:
            r *= 0.6
            centres = _ngon(cx, cy, r * 0.9, count, rng.uniform(0, math.pi))
        else:
            centres = [(cx, cy)]
        mask = Image.new("L", (size, size), 0)
        draw = ImageDraw.Draw(mask)
        for x, y in centres:
            _shape(draw, int(category), x, y, r)
        if material == 3:  # glass: translucent
            mask = mask.point(lambda v: v // 2)
        texture = Image.fromarray(_texture(int(material), int(colour), size, rng), "RGB")
        canvas.paste(texture, (0, 0), mask)
    return canvas


__all__ = ["RGB", "render_scene"]
