"""Numbers in running text written out as words: dates, times, ranges, currencies, percentages,
temperatures, units, ordinals and plain numbers, with each language's separators and word order.

Done by hand because no library does it for these ten languages: finding the numbers (the shapes
LLMs write: "1,299.99" in English, "1.299,99" in German, "1 299,99" in French and Russian, "3.5"
typed in German text), and the phrases around them (which word a unit or currency takes after
which number, the order of 百分之 and 零下 in Chinese, native Korean numbers before counters, the
German ordinal's ending after "am").  The words for the numbers themselves come from words.py.
Each step is one regular-expression pass without nested repetition: linear in the text's length.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from .lexicon import CURRENCY_CODES, CURRENCY_SYMBOLS, LEXICONS, Lexicon
from .words import cardinal, decimal, digits, korean_native, ordinal, year

# A letter of an alphabetic script: numbers glued to one ("mp3", "COVID19") are left alone.  CJK
# characters are not in it: "温度25度" has a number.
_LETTER = r"A-Za-z\u00C0-\u024F\u0370-\u03FF\u0400-\u04FF"
_NOT_AFTER = rf"(?<![{_LETTER}0-9.,_])"
_NOT_BEFORE_LETTER = rf"(?![{_LETTER}])"
_STARTS_WITH_LETTER = re.compile(rf"[{_LETTER}]")
_CJK = ("chinese", "japanese", "korean")
# Longer digit strings are read digit by digit (and never converted to int: Python limits that).
_LONGEST = 15
# Chinese measure words after which 2 is 两.
_ZH_MEASURES = frozenset("个只本张位次天件条台辆种名杯瓶块项层周岁米公斤倍")
# Korean counters read with native numbers (세 시, 두 개); the rest take Sino-Korean ones.
_KO_NATIVE_COUNTERS = ("시간", "시", "개", "명", "번째", "번", "살", "마리", "잔", "권", "가지", "달")
# German words after which an ordinal takes the -en ending ("am dritten Mai").
_DE_DATIVE = frozenset("am im vom zum beim dem den des zur ab seit bis".split())
_SCALES = (
    "thousand|million|billion|trillion|Tausend|Millionen|Million|Milliarden|Milliarde|Mio\\.|Mrd\\.|"
    "mille|millions?|milliards?|millones|millón|mil millones|milioni|milione|miliardi|miliardo|milhões|milhão|"
    "bilhões|bilhão|тысяч[аи]?|миллион(?:а|ов)?|миллиард(?:а|ов)?"
)


# -- pieces ------------------------------------------------------------------------------------


def _join(lex: Lexicon, *parts: str) -> str:
    joiner = "" if lex.language in ("chinese", "japanese") else " "
    return joiner.join(p for p in parts if p)


def _number(lex: Lexicon, sign: str, whole: str, fraction: str | None) -> str:
    """A signed number from its digit strings (group marks already removed)."""
    if fraction:
        text = decimal(whole, fraction, lex.language)
    elif len(whole) > 1 and whole.startswith("0"):
        text = digits(whole, lex.language)
    else:
        text = cardinal(int(whole), lex.language)
    if sign in ("-", "−") and (int(whole) or (fraction and int(fraction))):
        return _join(lex, lex.minus, text)
    if sign == "+":
        return _join(lex, lex.plus, text)
    return text


def _count(whole: str, fraction: str | None) -> tuple[int, bool]:
    return int(whole), bool(fraction and int(fraction))


# -- dates -------------------------------------------------------------------------------------


def _date(lex: Lexicon, day: int, month: int, year_: int | None, before: str = "") -> str | None:
    """A date as said in `lex`'s language; None if it is not a real date."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    language = lex.language
    y = year(year_, language) if year_ is not None else ""
    if language == "english":
        return f"{lex.months[month - 1]} {ordinal(day, language)}" + (f", {y}" if y else "")
    if language == "german":
        return _join(lex, _de_ordinal(day, before, before_month=True), lex.months[month - 1], y)
    if language in ("french", "italian"):
        first = {"french": "premier", "italian": "primo"}[language]
        return _join(lex, first if day == 1 else cardinal(day, language), lex.months[month - 1], y)
    if language in ("spanish", "portuguese"):
        first = "primeiro" if language == "portuguese" and day == 1 else cardinal(day, language)
        return f"{first} de {lex.months[month - 1]}" + (f" de {y}" if y else "")
    if language == "russian":
        day_words = _ru_ordinal(day, "ое")
        return _join(lex, day_words, lex.months[month - 1], f"{_ru_ordinal(year_, 'ого')} года" if year_ else "")
    if language == "korean":
        month_word = {6: "유", 10: "시"}.get(month, cardinal(month, language))
        return _join(lex, f"{y}년" if y else "", f"{month_word}월", f"{cardinal(day, language)}일")
    return (f"{y}年" if y else "") + f"{cardinal(month, language)}月{cardinal(day, language)}日"


def _ru_ordinal(n: int, ending: str) -> str:
    """A Russian ordinal with its last word given `ending` ("ое": neuter, "ого": genitive)."""
    words = ordinal(n, "russian").split()
    last = words[-1]
    if last.endswith("ий") and last != "третий" or last.endswith(("ый", "ой")):
        last = last[:-2] + ending
    elif last == "третий":
        last = "третье" if ending == "ое" else "третьего"
    return " ".join(words[:-1] + [last])


def _de_ordinal(n: int, before: str, before_month: bool = False) -> str:
    word = ordinal(n, "german")
    if before.lower() in _DE_DATIVE:
        return word + "n"
    return word + "r" if before_month else word


# -- times -------------------------------------------------------------------------------------


def _time(lex: Lexicon, hour: int, minute: int, second: int | None, meridiem: str) -> str | None:
    if hour > 24 or minute > 59 or (second is not None and second > 59):
        return None
    language = lex.language
    h, m = cardinal(hour, language), cardinal(minute, language)
    if language == "english":
        if minute == 0:
            text = f"{h} {meridiem}" if meridiem else (f"{h} hundred" if hour > 12 else f"{h} o'clock")
        else:
            text = f"{h} {'oh ' if minute < 10 else ''}{m}" + (f" {meridiem}" if meridiem else "")
    elif language == "german":
        text = ("ein" if hour == 1 else h) + " Uhr" + (f" {m}" if minute else "")
    elif language == "french":
        text = ("une heure" if hour == 1 else f"{h} heures") + (f" {m}" if minute else "")
    elif language in ("spanish", "italian", "portuguese"):
        one = {"spanish": "una", "italian": "una", "portuguese": "uma"}[language]
        hour_word = one if hour == 1 else ("duas" if language == "portuguese" and hour == 2 else h)
        text = hour_word + (f" y {m}" if language == "spanish" else f" e {m}") * bool(minute)
    elif language == "russian":
        text = f"{h} {'ноль ' if minute < 10 else ''}{m}" if minute else f"{h} ноль ноль"
    elif language == "chinese":
        hour_word = "两" if hour == 2 else h
        text = f"{hour_word}点" + (f"{'零' if minute < 10 else ''}{m}分" if minute else "")
    elif language == "japanese":
        text = f"{h}時" + (f"{m}分" if minute else "")
    else:  # korean: native hours, Sino-Korean minutes
        text = f"{korean_native(hour) or h} 시" + (f" {m} 분" if minute else "")
    if second is not None and second:
        text = _join(lex, text, cardinal(second, language), lex.form(lex.units["s"], second))
    if meridiem and language != "english":
        text = _join(lex, text, meridiem)
    return text


# -- the passes --------------------------------------------------------------------------------


class _Passes:
    """The compiled patterns and replacement functions of one language."""

    def __init__(self, lex: Lexicon) -> None:
        self.lex = lex
        g = re.escape(lex.group_marks)
        d = re.escape(lex.decimal_mark)
        # Comma-decimal languages also take "3.5" (an English habit in LLM output) when the dot
        # cannot be a group mark.
        decimal_marks = "[.,]" if lex.decimal_mark == "," else d
        self.amount = rf"(?P<int>\d{{1,3}}(?:[{g}]\d{{3}})+(?!\d)|\d+)(?:{decimal_marks}(?P<frac>\d+))?"
        months = "|".join(map(re.escape, lex.months)) or "(?!)"
        self.steps: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = []
        add = self._add
        add(r"(?<![\d-])(\d{4})-(\d{2})-(\d{2})(?![\d-])", self._iso_date)
        add(r"(?<![\d.])(\d{1,2})\.(\d{1,2})\.(\d{4})(?!\.?\d)", self._dotted_date)
        add(r"(?<![\d/])(\d{1,2})/(\d{1,2})/(\d{4})(?![\d/])", self._slash_date)
        if lex.language == "english":
            add(rf"\b({months})\.? (\d{{1,2}})(?:st|nd|rd|th)?(?:,? (\d{{4}}))?(?!\d)", self._en_month_day)
            add(rf"(?<!\d)(\d{{1,2}})(?:st|nd|rd|th)? (?:of )?({months})(?:,? (\d{{4}}))?\b", self._en_day_month)
        elif lex.language == "german":
            add(rf"(?:\b(\w+) )?(?<![\d.])(\d{{1,2}})\.\s?({months})(?: (\d{{4}}))?\b", self._de_day_month)
        elif lex.language == "russian":
            add(rf"(?<!\d)(\d{{1,2}}) ({months})(?: (\d{{4}})(?: ?(?:года|г\.))?)?", self._ru_day_month)
        elif lex.language == "chinese":
            add(r"(?<!\d)(\d{4})(?=\s?年)", lambda m: digits(m.group(1), "chinese"))
        add(
            r"(?<![\d:])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])"
            r"(?:\s?(?P<mer>[aApP])\.?[mM](?![A-Za-z]))?(?P<uhr> Uhr\b)?",
            self._clock,
        )
        if lex.language == "english":
            add(r"(?<![\d:])(\d{1,2})\s?(?P<mer>[aApP])\.?[mM](?![A-Za-z])", self._hour_meridiem)
            add(r"(?<![\d.,])(\d{0,2}[1-9]0)'?s\b", self._decade)
        if lex.language == "french":
            add(r"(?<![\d:])(\d{1,2}) ?h ?(\d{2})(?!\d)", lambda m: self._time(m, 1, 2))
        # Ranges: "5–10", "3-4 Tage", "5~10도" (the dash of "COVID-19" has a letter before it).
        space = "" if lex.language in ("chinese", "japanese") else " "
        add(r"(?<=\d)\s?[–—~〜]\s?(?=[-−]?\d)", lambda m: f"{space}{lex.range_word}{space}")
        add(
            r"(?<![\d\-.,])(\d{1,4})-(\d{1,4})(?![\d\-])",
            lambda m: f"{m.group(1)}{space}{lex.range_word}{space}{m.group(2)}",
        )
        if lex.language == "german":
            add(rf"(?:\b(\w+) )?(?<![\d.,])(\d{{1,3}})\.(?= [{_LETTER}])", self._de_ordinal_word)
        # "#1" -> "number one"
        add(r"#\s?(?=\d)", lambda m: f"{lex.number_word} " if lex.number_word else "")
        add(self._amount_pattern(), self._amount)

    def _add(self, pattern: str, fn: Callable[[re.Match[str]], str | None]) -> None:
        def replace(m: re.Match[str]) -> str:
            text = fn(m)
            return m.group(0) if text is None else text  # None: not what it looked like, left as written

        self.steps.append((re.compile(pattern), replace))

    def _amount_pattern(self) -> str:
        lex = self.lex
        units = sorted(lex.units, key=len, reverse=True)
        unit_alt = "|".join(_unit_pattern(u) for u in units)
        symbols = "|".join(re.escape(s) for s in sorted(CURRENCY_SYMBOLS, key=len, reverse=True))
        codes = "|".join(sorted(CURRENCY_CODES))
        ordinal_suffix = {
            "english": r"st|nd|rd|th",
            "french": r"ères?|ers?|res?|èmes?|emes?|e|ᵉʳ|ʳᵉ|ᵉ",
            "spanish": r"\.?[ºª]",
            "italian": r"\.?[ºª]",
            "portuguese": r"\.?[ºª]",
        }.get(lex.language, "(?!)")
        return (
            rf"{_NOT_AFTER}(?P<sign>[-−+](?=[$€£¥₩₽₹\d]))?(?:(?P<pre>{symbols})\s?|(?P<precode>{codes})\s)?"
            + self.amount
            + rf"(?:(?P<scale>\s(?:{_SCALES}))(?![{_LETTER}]))?"
            + r"(?:(?P<ord>"
            + ordinal_suffix
            + rf"){_NOT_BEFORE_LETTER}"
            + r"|\s?(?P<pct>%|％)"
            + r"|\s?(?P<deg>°\s?[CF]?|℃|℉)(?![A-Za-z])"
            + rf"|\s?(?P<post>{symbols}|{codes}\b)"
            + rf"|\s?(?P<unit>{unit_alt}){_NOT_BEFORE_LETTER}(?![²³])(?:\.(?=\s[a-zäöüß]))?"
            + r")?"
        )

    # -- replacement functions ----------------------------------------------------------------
    def _iso_date(self, m: re.Match[str]) -> str | None:
        return _date(self.lex, int(m.group(3)), int(m.group(2)), int(m.group(1)), _word_before(m))

    def _dotted_date(self, m: re.Match[str]) -> str | None:
        return _date(self.lex, int(m.group(1)), int(m.group(2)), int(m.group(3)), _word_before(m))

    def _slash_date(self, m: re.Match[str]) -> str | None:
        a, b, y = int(m.group(1)), int(m.group(2)), int(m.group(3))
        # month/day/year in American English, day/month/year everywhere else
        if self.lex.language == "english":
            return _date(self.lex, b, a, y)
        return _date(self.lex, a, b, y, _word_before(m))

    def _en_month_day(self, m: re.Match[str]) -> str | None:
        month = self.lex.months.index(m.group(1)) + 1
        return _date(self.lex, int(m.group(2)), month, int(m.group(3)) if m.group(3) else None)

    def _en_day_month(self, m: re.Match[str]) -> str | None:
        if not 1 <= int(m.group(1)) <= 31:
            return None
        text = f"the {ordinal(int(m.group(1)), 'english')} of {m.group(2)}"
        return text + (f" {year(int(m.group(3)), 'english')}" if m.group(3) else "")

    def _de_day_month(self, m: re.Match[str]) -> str | None:
        before = m.group(1) or ""
        month = self.lex.months.index(m.group(3)) + 1
        text = _date(self.lex, int(m.group(2)), month, int(m.group(4)) if m.group(4) else None, before)
        return text and (f"{before} {text}" if before else text)

    def _ru_day_month(self, m: re.Match[str]) -> str | None:
        month = self.lex.months.index(m.group(2)) + 1
        return _date(self.lex, int(m.group(1)), month, int(m.group(3)) if m.group(3) else None)

    def _clock(self, m: re.Match[str]) -> str | None:
        return self._time(m, 1, 2, 3)

    def _hour_meridiem(self, m: re.Match[str]) -> str | None:
        return self._time(m, 1)

    def _time(self, m: re.Match[str], hour: int, minute: int | None = None, second: int | None = None) -> str | None:
        meridiem = (m.groupdict().get("mer") or "").upper()
        return _time(
            self.lex,
            int(m.group(hour)),
            int(m.group(minute)) if minute else 0,
            int(m.group(second)) if second and m.group(second) else None,
            f"{meridiem} M" if meridiem else "",
        )

    def _decade(self, m: re.Match[str]) -> str:
        n = int(m.group(1))
        word = year(n, "english") if n >= 1000 else cardinal(n, "english")
        return word[:-1] + "ies" if word.endswith("y") else word + "s"

    def _de_ordinal_word(self, m: re.Match[str]) -> str:
        before = m.group(1) or ""
        word = _de_ordinal(int(m.group(2)), before)
        return f"{before} {word}" if before else word

    def _amount(self, m: re.Match[str]) -> str:
        lex = self.lex
        sign = m.group("sign") or ""
        whole = re.sub(r"\D", "", m.group("int"))
        fraction = m.group("frac")
        if len(whole) > _LONGEST or len(fraction or "") > _LONGEST:
            # an identifier, not an amount: read digit by digit
            tail = _join(lex, lex.point, digits(fraction, lex.language)) if fraction else ""
            return _join(lex, digits(whole, lex.language), tail)
        n, is_fraction = _count(whole, fraction)
        code = _currency(lex, m.group("pre") or m.group("precode") or m.group("post"))
        after = m.string[m.end() :]
        if code is not None:
            return _money(lex, sign, whole, fraction, code, m.group("scale"))
        scale = m.group("scale") or ""
        if m.group("ord"):
            suffix = m.group("ord")
            word = _ordinal_suffix(lex, n, suffix)
            if lex.language == "spanish" and word.endswith(("primero", "tercero")) and re.match(r" [a-zñáéíóú]", after):
                word = word[:-1]  # "el primer premio"
            return word + scale
        if m.group("pct"):
            number = _number(lex, sign, whole, fraction)
            if lex.language == "chinese":
                return f"{lex.percent}{number}"
            return _join(lex, number + scale, lex.form(lex.percent, n, is_fraction))
        if m.group("deg"):
            return _temperature(lex, sign, whole, fraction, m.group("deg"))
        if m.group("unit"):
            unit = m.group("unit")
            forms = lex.units.get(unit) or lex.units[unit.lower()]
            return _join(lex, _number(lex, sign, whole, fraction) + scale, lex.form(forms, n, is_fraction))
        text = self._plain(sign, whole, fraction, after) + scale
        # "4K", "3D": the letters stay, as a word of their own
        return text + " " if _STARTS_WITH_LETTER.match(after) else text

    def _plain(self, sign: str, whole: str, fraction: str | None, after: str) -> str:
        lex = self.lex
        language = lex.language
        if fraction or sign:
            return _number(lex, sign, whole, fraction)
        n = int(whole)
        if language in ("english", "german") and len(whole) == 4 and 1100 <= n <= 2099:
            return year(n, language)  # a bare four-digit number in running text is nearly always a year
        if language == "chinese" and n == 2 and after[:1] in _ZH_MEASURES:
            return "两"
        if language == "korean":
            counter = after.lstrip()
            if counter.startswith("번째") and n == 1:
                return "첫 "
            if counter.startswith(_KO_NATIVE_COUNTERS) and korean_native(n):
                return f"{korean_native(n)} "
            if counter.startswith("월") and n in (6, 10):
                return {6: "유", 10: "시"}[n]
        return _number(lex, sign, whole, fraction)

    def run(self, text: str) -> str:
        for pattern, fn in self.steps:
            text = pattern.sub(fn, text)
        return text


def _word_before(m: re.Match[str]) -> str:
    words = m.string[max(0, m.start() - 12) : m.start()].split()
    return words[-1] if words else ""


def _unit_pattern(unit: str) -> str:
    """How a unit symbol may be written: multi-letter ones in any case ("KM", "kWh"), single
    letters as printed (M is mega, not metre), and "s" only after a space ("the 1990s")."""
    if len(unit) > 1:
        return f"(?i:{re.escape(unit)})"
    return {"l": "[lL]", "w": "W", "v": "V", "s": "(?<=\\s)s"}.get(unit, re.escape(unit))


def _currency(lex: Lexicon, written: str | None) -> str | None:
    if not written:
        return None
    code = CURRENCY_SYMBOLS.get(written, written.upper())
    if code == "RMB" or (code == "JPY" and written == "¥" and lex.language == "chinese"):
        code = "CNY"
    return code if code in lex.currencies else None


def _money(lex: Lexicon, sign: str, whole: str, fraction: str | None, code: str, scale: str | None) -> str:
    unit, sub = lex.currencies[code]
    n = int(whole)
    if scale:
        # "$5 million": the currency word follows the scale word and is plural.
        return _join(lex, _number(lex, sign, whole, fraction) + scale, lex.form(unit, 5))
    cents = int(fraction) if fraction and len(fraction) == 2 else None
    if sub is not None and cents is not None:
        main = _join(lex, _number(lex, sign, whole, None), lex.form(unit, n))
        if not cents:
            return main
        conjunction = {
            "english": "and",
            "german": "und",
            "french": "et",
            "spanish": "con",
            "italian": "e",
            "portuguese": "e",
            "russian": "",
        }[lex.language]
        return _join(lex, main, conjunction, cardinal(cents, lex.language), lex.form(sub, cents))
    fraction = (fraction or "").rstrip("0") or None  # "¥500.00", "1.50 元"
    number = _number(lex, sign, whole, fraction)
    return _join(lex, number, lex.form(unit, n, bool(fraction)))


def _temperature(lex: Lexicon, sign: str, whole: str, fraction: str | None, written: str) -> str:
    n, is_fraction = _count(whole, fraction)
    scale = "F" if "F" in written or written == "℉" else ("C" if "C" in written or written == "℃" else "")
    if lex.language in _CJK:
        word = {"F": lex.fahrenheit, "C": lex.celsius}.get(scale, lex.degree)
        if lex.language == "chinese" and sign in ("-", "−"):
            return f"零下{_number(lex, '', whole, fraction)}{word}"
        return _join(lex, _number(lex, sign, whole, fraction), word)
    name = {"F": lex.fahrenheit, "C": lex.celsius}.get(scale, "")
    return _join(lex, _number(lex, sign, whole, fraction), lex.form(lex.degree, n, is_fraction), name)


def _ordinal_suffix(lex: Lexicon, n: int, suffix: str) -> str:
    language = lex.language
    feminine = suffix.endswith("ª") or suffix in ("re", "res", "ère", "ères", "ʳᵉ")
    if language == "french" and n == 1:
        return "première" if feminine else "premier"
    word = ordinal(n, language)
    if feminine and language in ("spanish", "italian", "portuguese"):
        word = " ".join(w[:-1] + "a" if w.endswith("o") else w for w in word.split())
    return word


@lru_cache(maxsize=16)
def _passes(language: str) -> _Passes:
    return _Passes(LEXICONS[language])


def write_out_numbers(text: str, language: str) -> str:
    """`text` with its numbers, dates, times, amounts and measures written out in `language`."""
    if not any(ch.isdigit() for ch in text):
        return text
    return _passes(language).run(text)
