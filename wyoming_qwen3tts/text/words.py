"""Numbers as words in each of the ten languages: cardinals, decimals, ordinals, years, digit strings.

num2words reads eight of the ten languages (it has no Chinese): cardinals, ordinals and years come
from it, tidied where its output is written rather than spoken (English commas, German
"eintausend").  Written here by hand: Chinese numerals (num2words has none), Korean native numbers
(used before counters such as 시 and 번째; num2words reads only Sino-Korean ones) and the reading of
decimals, whose fraction digits are read one by one in English, German, Chinese, Japanese and
Korean but as a number in the Romance languages, which num2words does not distinguish.
Conversions are cached: a reply repeats its small numbers, and num2words takes 10-300 us a call.
"""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache

from num2words import CONVERTER_CLASSES
from num2words.base import Num2Word_Base

from .lexicon import LEXICONS

# Languages whose fraction digits are read one by one ("drei Komma eins vier").
_DIGIT_FRACTIONS = frozenset({"english", "german", "chinese", "japanese", "korean"})
_CODES = {
    "english": "en",
    "german": "de",
    "french": "fr",
    "spanish": "es",
    "italian": "it",
    "portuguese": "pt",
    "russian": "ru",
    "japanese": "ja",
    "korean": "ko",
}
# num2words' cardinals and ordinals for a number this large (or larger) are no longer what anyone says.
_LARGEST = 10**15

_ZH_DIGITS = "零一二三四五六七八九"
_ZH_SMALL_UNITS = ("", "十", "百", "千")
_ZH_LARGE_UNITS = ("", "万", "亿", "万亿")


def _converter(language: str) -> Num2Word_Base:
    return CONVERTER_CLASSES[_CODES[language]]


def _zh_section(n: int) -> str:
    """0 < n < 10000 in Chinese, with 零 for each run of inner zeros."""
    out: list[str] = []
    zero = False
    for power in (3, 2, 1, 0):
        digit = n // 10**power % 10
        if digit == 0:
            zero = bool(out)
            continue
        if zero:
            out.append("零")
            zero = False
        out.append(_ZH_DIGITS[digit] + _ZH_SMALL_UNITS[power])
    return "".join(out)


def _zh_cardinal(n: int) -> str:
    if n == 0:
        return "零"
    sections = []
    while n:
        sections.append(n % 10000)
        n //= 10000
    out: list[str] = []
    for index in range(len(sections) - 1, -1, -1):
        section = sections[index]
        if section == 0:
            continue
        if out and (section < 1000 or sections[index + 1] == 0):
            out.append("零")  # a gap inside the number: 一万零五, 一亿零三百万
        out.append(_zh_section(section) + _ZH_LARGE_UNITS[index])
    text = "".join(out)
    return text[1:] if text.startswith("一十") else text  # 十五, not 一十五


@lru_cache(maxsize=4096)
def cardinal(n: int, language: str) -> str:
    """A whole number as words (negative numbers get the language's minus word from the caller)."""
    if n < 0:
        raise ValueError("cardinal() takes n >= 0; the caller says the sign")
    if n >= _LARGEST:
        return digits(str(n), language)
    if language == "chinese":
        return _zh_cardinal(n)
    text = _converter(language).to_cardinal(n)
    if language == "english":
        text = text.replace(",", "")
    elif language == "german" and text.startswith(("einhundert", "eintausend")):
        text = text[3:]  # "hundert", "tausend": what people say
    return text


def digits(text: str, language: str) -> str:
    """Each digit of `text` on its own: "007" -> "zero zero seven", "二零二四" for Chinese."""
    if language == "chinese":
        return "".join(_ZH_DIGITS[int(d)] for d in text)
    joiner = "" if language == "japanese" else " "
    return joiner.join(cardinal(int(d), language) for d in text)


@lru_cache(maxsize=1024)
def decimal(whole: str, fraction: str, language: str) -> str:
    """A non-negative decimal number, given its whole and fraction digits."""
    if language == "russian" and len(fraction) <= 6:
        return _converter(language).to_cardinal(Decimal(f"{int(whole)}.{fraction}"))
    point = LEXICONS[language].point
    if language in _DIGIT_FRACTIONS or len(fraction) > 3:
        tail = digits(fraction, language)
    else:
        zeros = len(fraction) - len(fraction.lstrip("0"))
        rest = fraction[zeros:]
        tail = " ".join([cardinal(0, language)] * zeros + ([cardinal(int(rest), language)] if rest else []))
    joiner = "" if language in ("chinese", "japanese") else " "
    return joiner.join([cardinal(int(whole), language), point, tail])


@lru_cache(maxsize=1024)
def ordinal(n: int, language: str) -> str:
    """An ordinal ("third", "dritte", "troisième"); Chinese, Japanese and Korean write their
    ordinals with a prefix or counter (第三, 세 번째) around a cardinal, so they get the cardinal."""
    if language in ("chinese", "japanese", "korean") or n >= _LARGEST:
        return cardinal(n, language)
    text = _converter(language).to_ordinal(n)
    if language == "english":
        text = text.replace(",", "")
    elif language == "german" and text.startswith(("einhundert", "eintausend")):
        text = text[3:]
    return text


@lru_cache(maxsize=512)
def year(n: int, language: str) -> str:
    """A year as it is said: "twenty twenty-four", "neunzehnhundertneunundneunzig", "二零二四"."""
    if language == "chinese":
        return digits(str(n), language)
    if language == "english" and 1100 <= n <= 2099:
        return _converter(language).to_year(n).replace(",", "")
    if language == "german" and 1100 <= n <= 1999:
        return _converter(language).to_year(n)
    return cardinal(n, language)


_KO_NATIVE_UNITS = ("", "하나", "둘", "셋", "넷", "다섯", "여섯", "일곱", "여덟", "아홉")
_KO_NATIVE_ATTRIBUTIVE = {"하나": "한", "둘": "두", "셋": "세", "넷": "네", "스물": "스무"}
_KO_NATIVE_TENS = ("", "열", "스물", "서른", "마흔", "쉰", "예순", "일흔", "여든", "아흔")


def korean_native(n: int) -> str | None:
    """1..99 in native Korean, in the form used before a counter (한 시, 스무 살); None outside."""
    if not 1 <= n <= 99:
        return None
    tens, ones = divmod(n, 10)
    if ones:
        last = _KO_NATIVE_UNITS[ones]
        return _KO_NATIVE_TENS[tens] + _KO_NATIVE_ATTRIBUTIVE.get(last, last)
    word = _KO_NATIVE_TENS[tens]
    return _KO_NATIVE_ATTRIBUTIVE.get(word, word)
