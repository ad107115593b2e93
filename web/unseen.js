// The characters a name or a program's text may hold that are not seen as themselves, and how they
// are shown: one rule for the dashboard (`shownName` in format.js) and the CLI (`shown` in
// src/client/output.ts, which imports this module; web/unseen.d.ts gives it the types).

/**
 * The characters a name or a program's text may hold that are not seen as themselves: controls (C0,
 * DEL, C1), the line and paragraph separators, and the format and default-ignorable characters —
 * bidirectional embeddings, overrides, isolates and marks (U+202A–U+202E, U+2066–U+2069, U+200E,
 * U+200F, U+061C), zero-width space, joiners, word joiner and BOM (U+200B–U+200D, U+2060, U+FEFF), the
 * soft hyphen, Hangul fillers, variation selectors, tags. Obeyed or unseen, they make a name read as
 * another: `invoice\u202efdp.csv` reads "invoicepdf.csv", `a\u200bb.csv` reads "ab.csv", and an
 * override reverses the text after it on its line (a size, a date, the rest of a message).
 */
export const UNSEEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}]/gu;

/** Letters of the scripts where a joiner (U+200C, U+200D) changes how letters join: it is seen there. */
const JOINING =
  "\\p{sc=Arabic}\\p{sc=Syriac}\\p{sc=Nko}\\p{sc=Mongolian}\\p{sc=Adlam}\\p{sc=Hanifi_Rohingya}\\p{sc=Devanagari}\\p{sc=Bengali}\\p{sc=Gurmukhi}\\p{sc=Gujarati}\\p{sc=Oriya}\\p{sc=Tamil}\\p{sc=Telugu}\\p{sc=Kannada}\\p{sc=Malayalam}\\p{sc=Sinhala}\\p{sc=Myanmar}\\p{sc=Khmer}";

/**
 * Where one of them is part of a character that is seen, it stays: a joiner in an emoji sequence
 * (woman, U+200D, laptop) or between letters of a joining script (Persian, Hindi), an emoji's variation
 * selector (a heart's U+FE0F; a keycap's; not after a plain ASCII letter or digit), a variation
 * selector after an ideograph or a symbol, a Mongolian free variation selector after a Mongolian
 * letter, the tags of a subdivision flag (Scotland's). The lookbehinds are bounded (a flag has ~6
 * tags, a letter a few marks): unbounded, each character of a long run of tags or marks scanned back
 * over all before it, and 64,000 tags in a previewed CSV cell took 8.6 s of the page's thread.
 */
const SEEN_IN_PLACE = new RegExp(
  [
    "(?<=\\p{Extended_Pictographic}[\\u{1F3FB}-\\u{1F3FF}\\uFE0F]?)\\u200D(?=\\p{Extended_Pictographic})",
    `(?<=[${JOINING}]\\p{M}{0,31})[\\u200C\\u200D](?=[${JOINING}])`,
    "(?<=\\p{Emoji}(?<![\\x00-\\x7F]))[\\uFE0E\\uFE0F]",
    "(?<=[0-9#*])\\uFE0F(?=\\u20E3)",
    "(?<=[\\p{Ideographic}\\p{S}])[\\uFE00-\\uFE0D\\u{E0100}-\\u{E01EF}]",
    "(?<=\\p{sc=Mongolian})[\\u180B-\\u180D\\u180F]",
    "(?<=\\u{1F3F4}[\\u{E0020}-\\u{E007E}]{0,31})[\\u{E0020}-\\u{E007F}]",
  ].join("|"),
  "uy",
);

/**
 * `s` with each character of UNSEEN as its code point, ⟨U+202E⟩, unless it is part of a character that
 * is seen (SEEN_IN_PLACE).
 */
export const showUnseen = (s) =>
  s.replace(UNSEEN, (c, at, all) => {
    SEEN_IN_PLACE.lastIndex = at;
    return SEEN_IN_PLACE.test(all)
      ? c
      : `\u27e8U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}\u27e9`;
  });
