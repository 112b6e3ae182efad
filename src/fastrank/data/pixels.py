"""The demo scenes rendered to small RGB images (PIL), for training a pixel encoder from scratch.

Every attribute of a scene (``fastrank.data.DEMO_ATTRIBUTES``) is drawn:

- place: the colour of the ground (lower part), time: the sky (upper part) -- day, night
  (the whole image darker), rain (streaks), cloudy (grey blobs);
- object: the shape of each figure (people have a head on a body, animals a wide body: the
  person / animal split is visible), colour: its fill colour, count: 1, 2, 3 or 4-5 figures;
- action: the pose -- the height of the figures in the image and their aspect (tall, square,
  wide);
- item: a small mark of its own shape and colour next to the first figure.

Positions, sizes and a little pixel noise are random, from the seed and the scene index only,
so the same seed gives the same images. Scenes are drawn at twice the size and downsampled
(anti-aliased).
"""
from __future__ import annotations

import numpy as np

from .. import _validation as V

_RGB = {  # demo colours, in DEMO_ATTRIBUTES["colour"] order
    "red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 170, 40), "yellow": (240, 220, 30),
    "black": (15, 15, 15), "white": (245, 245, 245), "brown": (130, 80, 30), "orange": (250, 140, 0),
    "pink": (250, 130, 200), "gray": (128, 128, 128)}
_COLOURS = list(_RGB.values())
_GROUND = [(70, 150, 60), (230, 210, 150), (100, 100, 105), (150, 200, 90), (210, 190, 160),
           (170, 120, 90), (235, 240, 250), (25, 90, 40), (60, 120, 170), (120, 140, 60)]
_SKY = [(150, 200, 250), (20, 20, 60), (110, 120, 140), (175, 180, 185)]
_ITEM_RGB = [None, (255, 255, 255), (255, 60, 60), (40, 40, 40), (140, 90, 40), (200, 0, 200), (0, 200, 200)]
# action -> (vertical centre as a fraction of the height, width / height aspect)
_POSE = [(0.62, 1.6), (0.78, 1.0), (0.40, 1.0), (0.82, 2.2), (0.70, 1.3), (0.55, 0.8), (0.65, 0.6),
         (0.70, 0.9), (0.86, 1.9)]


def _figure(draw, obj: int, cx: float, cy: float, w: float, h: float, fill) -> None:
    """Object ``obj`` (DEMO_ATTRIBUTES["object"] order) centred at (cx, cy) in a w x h box."""
    x0, y0, x1, y1 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    if obj < 5:  # people: a head on a body; the body's shape tells which
        r = min(w, h) * 0.22
        draw.ellipse([cx - r, y0, cx + r, y0 + 2 * r], fill=fill)
        body = [x0 + w * 0.2, y0 + 2 * r, x1 - w * 0.2, y1]
        if obj == 0:
            draw.rectangle(body, fill=fill)
        elif obj == 1:
            draw.polygon([(cx, body[1]), (body[0], y1), (body[2], y1)], fill=fill)
        elif obj == 2:
            draw.rectangle([body[0], body[1], body[2], cy + h * 0.25], fill=fill)
        elif obj == 3:
            draw.polygon([(cx, body[1]), (body[0], cy + h * 0.25), (body[2], cy + h * 0.25)], fill=fill)
        else:       # skateboarder: a body on a board
            draw.rectangle([body[0], body[1], body[2], y1 - h * 0.15], fill=fill)
            draw.rectangle([x0, y1 - h * 0.1, x1, y1], fill=(60, 60, 60))
        return
    body = [x0, cy - h * 0.25, x1, cy + h * 0.3]
    if obj == 5:      # dog: body + head up front
        draw.ellipse(body, fill=fill)
        draw.ellipse([x1 - w * 0.3, y0, x1, y0 + h * 0.4], fill=fill)
    elif obj == 6:    # cat: body + ears
        draw.ellipse(body, fill=fill)
        draw.polygon([(x1 - w * 0.3, body[1]), (x1 - w * 0.2, y0), (x1 - w * 0.1, body[1])], fill=fill)
    elif obj == 7:    # horse: a box on legs
        draw.rectangle(body, fill=fill)
        draw.rectangle([x0, body[3], x0 + w * 0.15, y1], fill=fill)
        draw.rectangle([x1 - w * 0.15, body[3], x1, y1], fill=fill)
    elif obj == 8:    # bird: a triangle
        draw.polygon([(x0, cy), (x1, y0), (x1, y1)], fill=fill)
    elif obj == 9:    # cow: a box with spots
        draw.rectangle(body, fill=fill)
        draw.ellipse([cx - w * 0.15, cy - h * 0.1, cx + w * 0.05, cy + h * 0.1], fill=(20, 20, 20))
    elif obj == 10:   # sheep: a round woolly body
        draw.ellipse([x0, y0 + h * 0.1, x1, y1], fill=fill, outline=(240, 240, 240), width=2)
    else:             # elephant: a big body with a trunk
        draw.ellipse(body, fill=fill)
        draw.rectangle([x1 - w * 0.12, cy, x1, y1], fill=fill)


def render_scenes(attributes, size: int = 32, seed: int = 0, noise: float = 0.03) -> np.ndarray:
    """Render demo scenes: attributes (n, 7) int (``DemoSplit.attributes``) -> images
    (n, 3, size, size) float32 in [0, 1]. Deterministic in (attributes, size, seed)."""
    from PIL import Image, ImageDraw

    attrs = np.asarray(attributes)
    if attrs.ndim != 2 or attrs.shape[1] != 7 or not np.issubdtype(attrs.dtype, np.integer):
        raise ValueError(f"attributes must be an integer (n, 7) array of demo scene attributes, got "
                         f"{attrs.dtype} of shape {attrs.shape}")
    size = V.check_int(size, "size", minimum=8)
    noise = V.check_nonnegative(noise, "noise")
    s = 2 * size                                               # drawn at 2x, downsampled
    out = np.empty((attrs.shape[0], 3, size, size), np.float32)
    for i, (obj, col, act, plc, cnt, tim, itm) in enumerate(attrs.tolist()):
        rng = np.random.default_rng([int(seed), 7, i])
        horizon = s * rng.uniform(0.35, 0.5)
        im = Image.new("RGB", (s, s), _GROUND[plc])
        draw = ImageDraw.Draw(im)
        draw.rectangle([0, 0, s, horizon], fill=_SKY[tim])
        if tim == 3:      # clouds
            for _ in range(3):
                x, y = rng.uniform(0, s), rng.uniform(0, horizon * 0.8)
                draw.ellipse([x - s * 0.15, y - s * 0.05, x + s * 0.15, y + s * 0.05], fill=(220, 220, 225))
        n_fig = (1, 2, 3, int(rng.integers(4, 6)))[cnt]
        yc, aspect = _POSE[act]
        base = s * (0.42 if n_fig == 1 else 0.34 if n_fig < 4 else 0.26) * rng.uniform(0.85, 1.15)
        h = base / np.sqrt(aspect)
        w = base * np.sqrt(aspect)
        xs = (np.arange(n_fig) + rng.uniform(0.3, 0.7, n_fig)) * (s / n_fig)
        for x in xs:
            y = s * yc + rng.uniform(-0.05, 0.05) * s
            _figure(draw, obj, float(x), float(y), w, h, _COLOURS[col])
        if itm:
            x, y, r = float(xs[0]) + w * 0.55, s * yc + h * 0.3, s * 0.07
            box = [x - r, y - r, x + r, y + r]
            if itm in (1, 2):
                draw.ellipse(box, fill=_ITEM_RGB[itm])
            elif itm == 3:
                draw.pieslice([x - 2 * r, y - 3 * r, x + 2 * r, y + r], 180, 360, fill=_ITEM_RGB[itm])
            elif itm == 6:
                draw.ellipse([x - 2 * r, y - r, x, y + r], outline=_ITEM_RGB[itm], width=2)
                draw.ellipse([x, y - r, x + 2 * r, y + r], outline=_ITEM_RGB[itm], width=2)
            else:
                draw.rectangle(box, fill=_ITEM_RGB[itm])
        if tim == 2:      # rain
            for _ in range(12):
                x, y = rng.uniform(0, s), rng.uniform(0, s)
                draw.line([x, y, x - s * 0.04, y + s * 0.12], fill=(200, 210, 235), width=1)
        img = np.asarray(im.resize((size, size), Image.BOX), np.float32) / 255.0
        if tim == 1:      # night: everything darker
            img *= 0.45
        img += noise * rng.standard_normal(img.shape).astype(np.float32)
        out[i] = np.clip(img, 0.0, 1.0).transpose(2, 0, 1)
    return out
