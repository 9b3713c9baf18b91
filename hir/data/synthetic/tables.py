"""The synthetic world as tables: entity names and text, metadata, and the planted ground truth.

Text (titles, names, descriptions) is built from per-interest vocabularies, so a language model
can recover the hierarchy from content alone. The ground truth states each entity's planted
interests, for the hierarchy-recovery metrics. Words are drawn from one seeded stream
(``[seed, 2]``), so a spec always writes the same tables.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from hir.data.synthetic.spec import SyntheticSpec
from hir.data.synthetic.world import REGIONS, World

# Per coarse interest: name | product nouns | fine interests "name: three related words", ';'-separated.
# Real words, so a sentence encoder places related titles near each other.
VOCAB = """
footwear | shoe sneaker boot | running: trail marathon cushioned; hiking: waterproof mountain ankle; basketball: court dunk hightop; formal: leather oxford polished; sandals: beach strap summer; kids: velcro school playground; winter: insulated snow fleece; skate: suede grip vulcanized
kitchen | pan pot cookware | baking: oven cake dough; coffee: espresso grinder brew; knives: chef blade sharpening; grilling: barbecue charcoal smoker; storage: container jar lid; blender: smoothie juice pulse; tea: kettle leaf infuser; cast iron: skillet seasoned dutch
electronics | device gadget accessory | audio: headphones wireless bass; gaming: console controller joystick; camera: lens tripod mirrorless; phone: smartphone charger case; laptop: notebook keyboard ultrabook; television: screen remote hdmi; smart home: thermostat sensor hub; wearable: smartwatch tracker band
books | book paperback edition | mystery: detective crime thriller; romance: love novel passion; science fiction: space galaxy robot; history: war empire ancient; cooking: recipes cuisine homemade; children: picture bedtime fairy; biography: memoir life leader; poetry: verse poems sonnet
garden | plant seed planter | vegetables: tomato lettuce harvest; flowers: rose tulip bloom; lawn: mower grass turf; tools: shovel rake pruner; irrigation: hose sprinkler drip; houseplants: succulent fern terrarium; trees: sapling orchard fruit; pest control: organic repellent aphid
beauty | cosmetic cream kit | skincare: moisturizer serum hydrating; makeup: lipstick mascara foundation; hair: shampoo conditioner curl; fragrance: perfume cologne scent; nails: polish manicure gel; shaving: razor beard trimmer; sun care: sunscreen spf tan; bath: soap bubble lavender
toys | toy game playset | building: bricks construction creative; dolls: dollhouse doll dress; puzzles: jigsaw pieces brain; board games: dice strategy family; outdoor play: swing slide sandbox; plush: teddy bear soft; vehicles: truck racing remote; science kits: experiment chemistry microscope
sports | gear equipment accessories | yoga: mat stretch pilates; cycling: bike helmet pedal; swimming: goggles swimsuit pool; tennis: racket serve string; fitness: dumbbell kettlebell workout; camping: tent sleeping lantern; fishing: rod reel lure; golf: club putter tee
pets | pet supply companion | dogs: leash collar puppy; cats: litter scratching kitten; aquarium: fish tank filter; birds: cage perch parrot; small pets: hamster rabbit hutch; pet food: kibble treats grain; pet grooming: fur deshedding clipper; pet beds: cushion orthopedic crate
home decor | decor accent piece | lighting: lamp bulb chandelier; rugs: carpet woven runner; wall art: canvas print frame; candles: wax wick scented; curtains: drapes blackout sheer; clocks: pendulum alarm dial; vases: ceramic glass bouquet; cushions: pillow throw velvet
automotive | car vehicle auto | tires: tread wheel alloy; motor oil: synthetic filter engine; detailing: shine detailing microfiber; batteries: jumper starter terminal; interior: seat cover floor; navigation: gps dashcam mount; repair tools: wrench jack socket; lights: headlight led fog
groceries | food pack snack | dairy: milk cheese yogurt; bakery: bread bagel croissant; produce: apple banana fresh; meat: beef chicken steak; beverages: soda juice sparkling; snacks: chips cookies crackers; frozen: pizza icecream dessert; pantry: pasta rice flour
office | office supply desk | paper: ream printer sheets; pens: ballpoint ink marker; furniture: chair ergonomic standing; organization: folder binder label; printing: toner cartridge inkjet; shipping: envelope tape box; art supplies: paint brush sketch; calendars: planner agenda monthly
clothing | apparel shirt wear | denim: jeans jacket indigo; dresses: gown maxi floral; outerwear: coat parka windbreaker; activewear: leggings sweat moisture; knitwear: sweater wool cardigan; basics: socks briefs cotton; swimwear: bikini trunks lycra; formalwear: suit tie tuxedo
music | instrument music studio | guitar: acoustic strings fret; piano: keys digital grand; drums: snare cymbal drumsticks; vinyl: record turntable album; dj: mixer crossfader deck; violin: bow orchestra rosin; microphone: vocal condenser podcast; brass: trumpet saxophone horn
travel | luggage travel bag | suitcases: carryon spinner hardshell; backpacks: daypack rucksack straps; accessories: adapter neck lock; maps: guide atlas compass; toiletries: bottles pouch miniature; duffels: weekender gym duffel; packing: cubes organizer compression; passport: wallet rfid holder
"""
GENERIC = ["new", "classic", "premium", "lightweight", "durable", "compact", "deluxe", "essential", "pro", "original", "everyday", "signature", "modern", "vintage", "eco", "ultra", "plus", "mini", "max", "smart"]
# when more interests are asked for than VOCAB holds, names repeat with one of these qualifiers
QUALIFIERS = ["urban", "alpine", "coastal", "royal", "nordic", "tropical", "desert", "arctic", "lunar", "solar"]
BRAND_HEAD = ["nor", "vel", "zen", "aur", "kal", "mir", "sol", "tor", "lum", "bri", "cor", "dax", "evo", "fen", "gal", "hal"]
BRAND_TAIL = ["a", "ix", "on", "ora", "ex", "ia", "um", "ano", "ette", "ik"]
SEASONS = ["spring", "summer", "autumn", "winter", "holiday", "weekend"]
PROMOS = ["sale", "launch", "deals", "clearance", "collection"]


def _vocab(n_coarse: int, n_fine: int) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """Names and words for every interest: coarse names, coarse nouns, fine names (global fine
    order), fine words."""
    rows = []
    for line in VOCAB.strip().splitlines():
        name, nouns, fines = (x.strip() for x in line.split("|"))
        rows.append((name, nouns.split(), [tuple(f.split(":")) for f in fines.split(";")]))
    c_names, c_nouns, f_names, f_words = [], [], [], []
    for c in range(n_coarse):
        name, nouns, fines = rows[c % len(rows)]
        qual = f"{QUALIFIERS[(c // len(rows) - 1) % len(QUALIFIERS)]} " if c >= len(rows) else ""
        c_names.append(qual + name)
        c_nouns.append(nouns)
        for j in range(n_fine):
            fname, words = fines[j % len(fines)]
            fq = f"{QUALIFIERS[(j // len(fines) - 1) % len(QUALIFIERS)]} " if j >= len(fines) else ""
            f_names.append(qual + fq + fname.strip())
            f_words.append(words.split())
    return c_names, c_nouns, f_names, f_words



def _words(rng: np.random.Generator, lists: list[list[str]], which: np.ndarray) -> pl.Series:
    """One random word of ``lists[which[i]]`` per row (vectorised through a flat vocabulary)."""
    flat = [w for ws in lists for w in ws]
    first = np.cumsum([0, *map(len, lists)])[:-1]
    lens = np.array([len(ws) for ws in lists])
    return pl.Series(flat).gather(first[which] + (rng.random(len(which)) * lens[which]).astype(np.int64))


def _concat(parts: list[pl.Series | str]) -> pl.Series:
    """Space-joined text from word columns (Series) and literal words (str)."""
    frame = pl.DataFrame({f"w{i}": p for i, p in enumerate(parts) if isinstance(p, pl.Series)})
    exprs = [pl.col(f"w{i}") if isinstance(p, pl.Series) else pl.lit(p) for i, p in enumerate(parts)]
    return frame.select(pl.concat_str(exprs, separator=" ").alias("text")).to_series()


def entity_tables(spec: SyntheticSpec, w: World) -> dict[str, pl.DataFrame]:
    """Metadata tables (Int64 keys) and the ground truth, from the world of ``spec``."""
    rng = np.random.default_rng([spec.seed, 2])
    C, F = w.n_coarse, w.n_fine
    c_names, c_nouns, f_names, f_words = _vocab(C, F)
    pick = lambda seq, idx: pl.Series(list(seq)).gather(idx)  # noqa: E731
    brand = [
        (BRAND_HEAD[a % 16] + BRAND_TAIL[(a // 16) % 10]).capitalize() + (str(a // 160) if a >= 160 else "")
        for a in range(len(w.adv_start))
    ]
    pf, pc = w.product_fine, w.product_fine // F
    products = pl.DataFrame({
        "key": np.arange(w.n_products),
        "text": _concat([
            _words(rng, f_words, pf), pick(f_names, pf), _words(rng, c_nouns, pc),
            pick(GENERIC, rng.integers(len(GENERIC), size=w.n_products)),
        ]),
        "attr_price": w.price,
        "advertiser": w.product_advertiser,
        "category": w.product_category,
    })
    advertisers = pl.DataFrame({
        "key": np.arange(len(w.adv_start)),
        "text": _concat([pl.Series(brand), pick(c_names, w.adv_primary)]),
    })
    cf = w.campaign_fine
    campaigns = pl.DataFrame({
        "key": np.arange(w.n_campaigns),
        "text": _concat([
            pick(brand, w.campaign_advertiser), pick(SEASONS, rng.integers(len(SEASONS), size=len(cf))),
            pick(PROMOS, rng.integers(len(PROMOS), size=len(cf))), "on", _words(rng, f_words, cf),
            pick(f_names, cf), _words(rng, c_nouns, cf // F),
        ]),
        "advertiser": w.campaign_advertiser,
        "start": w.campaign_start, "end": w.campaign_end,
    }).with_columns(pl.col("start", "end").cast(pl.Datetime("us")).dt.replace_time_zone("UTC"))
    fine_ids = np.arange(C * F)
    categories = pl.DataFrame({
        "key": np.r_[np.arange(C), C + fine_ids],
        "text": [*c_names, *(f"{c_names[f // F]} > {f_names[f]}" for f in fine_ids)],
        "attr_level": np.r_[np.ones(C), np.full(C * F, 2.0)],
        "parent": pl.Series(np.r_[np.full(C, -1), fine_ids // F]).replace(-1, None),
    })
    n_u = len(w.user_start)
    users = pl.DataFrame({"key": np.arange(n_u), "attr_age": w.user_age, "attr_region": pick(REGIONS, w.user_region)})
    slots = w.slot_weight.shape[1]
    mixture = pl.DataFrame({
        "user": np.repeat(np.arange(n_u), slots), "fine": w.slot_fine.ravel(), "weight": w.slot_weight.ravel(),
    }).filter(pl.col("weight") > 0).with_columns((pl.col("fine") // F).alias("coarse"))
    return {
        "products": products, "advertisers": advertisers, "campaigns": campaigns, "categories": categories,
        "users": users,
        "promotions": pl.DataFrame({"campaign": w.promotions[:, 0], "product": w.promotions[:, 1]}),
        # keys as text and interests as Int32, like truth.parquet, so the three join to graph/nodes
        "user_interests": mixture.select(
            pl.col("user").cast(pl.String).alias("key"), pl.col("coarse", "fine").cast(pl.Int32), "weight"
        ),
        "interests": pl.DataFrame({
            "fine": fine_ids, "coarse": fine_ids // F, "fine_name": f_names, "coarse_name": pick(c_names, fine_ids // F),
        }).with_columns(pl.col("fine", "coarse").cast(pl.Int32)),
        "truth": _truth(w, mixture),
    }


def _truth(w: World, mixture: pl.DataFrame) -> pl.DataFrame:
    """entity_type, key (text, as in graph/nodes), coarse, fine (null where not defined), weight
    (share of the entity's mass in that interest), late (appears in the late window)."""
    F = w.n_fine
    # main interest: the heaviest coarse interest, then the heaviest fine one inside it (ties: lowest id)
    main_coarse = (
        mixture.group_by("user", "coarse").agg(pl.col("weight").sum())
        .sort("user", "weight", "coarse", descending=[False, True, False]).unique("user", keep="first")
    )
    main_fine = (
        mixture.join(main_coarse.select("user", "coarse"), on=["user", "coarse"])
        .sort("user", "weight", "fine", descending=[False, True, False]).unique("user", keep="first")
    )
    users = main_coarse.join(main_fine.select("user", "fine"), on="user").sort("user").select(
        pl.lit("user").alias("entity_type"), pl.col("user").alias("key"), "coarse", "fine", "weight",
        pl.Series(w.user_start >= w.late_start).alias("late"),
    )
    adv = pl.DataFrame({"a": w.product_advertiser, "coarse": w.product_fine // F}).group_by("a", "coarse").len()
    adv = adv.with_columns((pl.col("len") / pl.col("len").sum().over("a")).alias("weight")).sort(
        "a", "weight", "coarse", descending=[False, True, False]).unique("a", keep="first")
    advertisers = pl.DataFrame({"key": np.arange(len(w.adv_start)), "primary": w.adv_primary,
                                "late": w.adv_start >= w.late_start}).join(adv, left_on="key", right_on="a", how="left")
    C = w.n_coarse
    parts = [
        pl.DataFrame({"entity_type": "product", "key": np.arange(w.n_products), "coarse": w.product_fine // F,
                      "fine": w.product_fine, "weight": 1.0, "late": w.product_start >= w.late_start}),
        users,
        advertisers.select(pl.lit("advertiser").alias("entity_type"), "key",
                           pl.coalesce("coarse", "primary").alias("coarse"), pl.lit(None, pl.Int64).alias("fine"),
                           pl.col("weight").fill_null(0.0), "late"),
        pl.DataFrame({"entity_type": "campaign", "key": np.arange(w.n_campaigns), "coarse": w.campaign_fine // F,
                      "fine": w.campaign_fine, "weight": 1.0, "late": w.campaign_start >= w.late_start}),
        pl.DataFrame({"entity_type": "category", "key": np.arange(C + C * F),
                      "coarse": np.r_[np.arange(C), np.arange(C * F) // F],
                      "fine": pl.Series(np.r_[np.full(C, -1), np.arange(C * F)]).replace(-1, None),
                      "weight": 1.0, "late": False}),
    ]
    schema = {"entity_type": pl.String, "key": pl.String, "coarse": pl.Int32, "fine": pl.Int32,
              "weight": pl.Float64, "late": pl.Boolean}
    return pl.concat([p.select(pl.col(c).cast(t) for c, t in schema.items()) for p in parts])

