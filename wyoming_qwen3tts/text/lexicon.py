"""The words each of the ten languages uses around numbers: marks, signs, units, currencies, months.

Data only (plus the plural rule that picks a word's form); numbers.py does the reading.  Forms are
written "singular|plural" ("one|few|many" for Russian); Chinese, Japanese and Korean have one form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The units read after a number, by the symbol LLMs write.  The longest symbol wins ("km/h" before
# "km" before "m"), so the order here does not matter.
_UNITS: dict[str, dict[str, str]] = {
    "english": {
        "km": "kilometer|kilometers", "m": "meter|meters", "cm": "centimeter|centimeters",
        "mm": "millimeter|millimeters", "kg": "kilogram|kilograms", "g": "gram|grams", "mg": "milligram|milligrams",
        "l": "liter|liters", "ml": "milliliter|milliliters", "km/h": "kilometer per hour|kilometers per hour",
        "mph": "mile per hour|miles per hour", "m/s": "meter per second|meters per second",
        "kwh": "kilowatt hour|kilowatt hours", "kw": "kilowatt|kilowatts", "w": "watt|watts", "v": "volt|volts",
        "gb": "gigabyte|gigabytes", "mb": "megabyte|megabytes", "tb": "terabyte|terabytes",
        "h": "hour|hours", "min": "minute|minutes", "s": "second|seconds", "ms": "millisecond|milliseconds",
        "mi": "mile|miles", "ft": "foot|feet", "lb": "pound|pounds", "lbs": "pound|pounds", "oz": "ounce|ounces",
        "m²": "square meter|square meters", "km²": "square kilometer|square kilometers", "m³": "cubic meter|cubic meters",
    },
    "german": {
        "km": "Kilometer|Kilometer", "m": "Meter|Meter", "cm": "Zentimeter|Zentimeter", "mm": "Millimeter|Millimeter",
        "kg": "Kilogramm|Kilogramm", "g": "Gramm|Gramm", "mg": "Milligramm|Milligramm", "l": "Liter|Liter",
        "ml": "Milliliter|Milliliter", "km/h": "Kilometer pro Stunde|Kilometer pro Stunde",
        "mph": "Meile pro Stunde|Meilen pro Stunde", "m/s": "Meter pro Sekunde|Meter pro Sekunde",
        "kwh": "Kilowattstunde|Kilowattstunden", "kw": "Kilowatt|Kilowatt", "w": "Watt|Watt", "v": "Volt|Volt",
        "gb": "Gigabyte|Gigabyte", "mb": "Megabyte|Megabyte", "tb": "Terabyte|Terabyte", "h": "Stunde|Stunden",
        "min": "Minute|Minuten", "std": "Stunde|Stunden", "sek": "Sekunde|Sekunden", "s": "Sekunde|Sekunden", "ms": "Millisekunde|Millisekunden", "mi": "Meile|Meilen",
        "ft": "Fuß|Fuß", "lb": "Pfund|Pfund", "lbs": "Pfund|Pfund", "oz": "Unze|Unzen",
        "m²": "Quadratmeter|Quadratmeter", "km²": "Quadratkilometer|Quadratkilometer", "m³": "Kubikmeter|Kubikmeter",
    },
    "french": {
        "km": "kilomètre|kilomètres", "m": "mètre|mètres", "cm": "centimètre|centimètres", "mm": "millimètre|millimètres",
        "kg": "kilogramme|kilogrammes", "g": "gramme|grammes", "mg": "milligramme|milligrammes", "l": "litre|litres",
        "ml": "millilitre|millilitres", "km/h": "kilomètre par heure|kilomètres par heure",
        "mph": "mile par heure|miles par heure", "m/s": "mètre par seconde|mètres par seconde",
        "kwh": "kilowattheure|kilowattheures", "kw": "kilowatt|kilowatts", "w": "watt|watts", "v": "volt|volts",
        "gb": "gigaoctet|gigaoctets", "go": "gigaoctet|gigaoctets", "mb": "mégaoctet|mégaoctets",
        "mo": "mégaoctet|mégaoctets", "tb": "téraoctet|téraoctets",
        "h": "heure|heures", "min": "minute|minutes", "s": "seconde|secondes", "ms": "milliseconde|millisecondes",
        "mi": "mile|miles", "ft": "pied|pieds", "lb": "livre|livres", "lbs": "livre|livres", "oz": "once|onces",
        "m²": "mètre carré|mètres carrés", "km²": "kilomètre carré|kilomètres carrés", "m³": "mètre cube|mètres cubes",
    },
    "spanish": {
        "km": "kilómetro|kilómetros", "m": "metro|metros", "cm": "centímetro|centímetros", "mm": "milímetro|milímetros",
        "kg": "kilogramo|kilogramos", "g": "gramo|gramos", "mg": "miligramo|miligramos", "l": "litro|litros",
        "ml": "mililitro|mililitros", "km/h": "kilómetro por hora|kilómetros por hora",
        "mph": "milla por hora|millas por hora", "m/s": "metro por segundo|metros por segundo",
        "kwh": "kilovatio hora|kilovatios hora", "kw": "kilovatio|kilovatios", "w": "vatio|vatios", "v": "voltio|voltios",
        "gb": "gigabyte|gigabytes", "mb": "megabyte|megabytes", "tb": "terabyte|terabytes", "h": "hora|horas",
        "min": "minuto|minutos", "s": "segundo|segundos", "ms": "milisegundo|milisegundos", "mi": "milla|millas",
        "ft": "pie|pies", "lb": "libra|libras", "lbs": "libra|libras", "oz": "onza|onzas",
        "m²": "metro cuadrado|metros cuadrados", "km²": "kilómetro cuadrado|kilómetros cuadrados",
        "m³": "metro cúbico|metros cúbicos",
    },
    "italian": {
        "km": "chilometro|chilometri", "m": "metro|metri", "cm": "centimetro|centimetri", "mm": "millimetro|millimetri",
        "kg": "chilogrammo|chilogrammi", "g": "grammo|grammi", "mg": "milligrammo|milligrammi", "l": "litro|litri",
        "ml": "millilitro|millilitri", "km/h": "chilometro orario|chilometri orari",
        "mph": "miglio orario|miglia orarie", "m/s": "metro al secondo|metri al secondo",
        "kwh": "chilowattora|chilowattora", "kw": "chilowatt|chilowatt", "w": "watt|watt", "v": "volt|volt",
        "gb": "gigabyte|gigabyte", "mb": "megabyte|megabyte", "tb": "terabyte|terabyte", "h": "ora|ore",
        "min": "minuto|minuti", "s": "secondo|secondi", "ms": "millisecondo|millisecondi", "mi": "miglio|miglia",
        "ft": "piede|piedi", "lb": "libbra|libbre", "lbs": "libbra|libbre", "oz": "oncia|once",
        "m²": "metro quadrato|metri quadrati", "km²": "chilometro quadrato|chilometri quadrati",
        "m³": "metro cubo|metri cubi",
    },
    "portuguese": {
        "km": "quilômetro|quilômetros", "m": "metro|metros", "cm": "centímetro|centímetros", "mm": "milímetro|milímetros",
        "kg": "quilo|quilos", "g": "grama|gramas", "mg": "miligrama|miligramas", "l": "litro|litros",
        "ml": "mililitro|mililitros", "km/h": "quilômetro por hora|quilômetros por hora",
        "mph": "milha por hora|milhas por hora", "m/s": "metro por segundo|metros por segundo",
        "kwh": "quilowatt-hora|quilowatts-hora", "kw": "quilowatt|quilowatts", "w": "watt|watts", "v": "volt|volts",
        "gb": "gigabyte|gigabytes", "mb": "megabyte|megabytes", "tb": "terabyte|terabytes", "h": "hora|horas",
        "min": "minuto|minutos", "s": "segundo|segundos", "ms": "milissegundo|milissegundos", "mi": "milha|milhas",
        "ft": "pé|pés", "lb": "libra|libras", "lbs": "libra|libras", "oz": "onça|onças",
        "m²": "metro quadrado|metros quadrados", "km²": "quilômetro quadrado|quilômetros quadrados",
        "m³": "metro cúbico|metros cúbicos",
    },
    "russian": {
        "km": "километр|километра|километров", "м": "метр|метра|метров", "m": "метр|метра|метров",
        "км": "километр|километра|километров", "cm": "сантиметр|сантиметра|сантиметров",
        "см": "сантиметр|сантиметра|сантиметров", "mm": "миллиметр|миллиметра|миллиметров",
        "мм": "миллиметр|миллиметра|миллиметров", "kg": "килограмм|килограмма|килограммов",
        "кг": "килограмм|килограмма|килограммов", "g": "грамм|грамма|граммов",
        "l": "литр|литра|литров", "л": "литр|литра|литров", "ml": "миллилитр|миллилитра|миллилитров",
        "мл": "миллилитр|миллилитра|миллилитров", "km/h": "километр в час|километра в час|километров в час",
        "км/ч": "километр в час|километра в час|километров в час",
        "m/s": "метр в секунду|метра в секунду|метров в секунду", "м/с": "метр в секунду|метра в секунду|метров в секунду",
        "kwh": "киловатт-час|киловатт-часа|киловатт-часов", "квт·ч": "киловатт-час|киловатт-часа|киловатт-часов",
        "kw": "киловатт|киловатта|киловатт", "квт": "киловатт|киловатта|киловатт", "w": "ватт|ватта|ватт",
        "вт": "ватт|ватта|ватт", "v": "вольт|вольта|вольт",
        "gb": "гигабайт|гигабайта|гигабайт", "гб": "гигабайт|гигабайта|гигабайт",
        "mb": "мегабайт|мегабайта|мегабайт", "мб": "мегабайт|мегабайта|мегабайт",
        "h": "час|часа|часов", "ч": "час|часа|часов", "min": "минута|минуты|минут", "мин": "минута|минуты|минут",
        "s": "секунда|секунды|секунд", "сек": "секунда|секунды|секунд",
        "m²": "квадратный метр|квадратных метра|квадратных метров",
        "м²": "квадратный метр|квадратных метра|квадратных метров",
    },
    "chinese": {
        "km": "公里", "m": "米", "cm": "厘米", "mm": "毫米", "kg": "公斤", "g": "克", "mg": "毫克", "l": "升",
        "ml": "毫升", "km/h": "公里每小时", "mph": "英里每小时", "m/s": "米每秒", "kwh": "千瓦时", "kw": "千瓦",
        "w": "瓦", "v": "伏", "gb": "GB", "mb": "MB", "tb": "TB", "h": "小时", "min": "分钟", "s": "秒", "ms": "毫秒",
        "mi": "英里", "ft": "英尺", "lb": "磅", "lbs": "磅", "oz": "盎司", "m²": "平方米", "km²": "平方公里", "m³": "立方米",
    },
    "japanese": {
        "km": "キロメートル", "m": "メートル", "cm": "センチメートル", "mm": "ミリメートル", "kg": "キログラム",
        "g": "グラム", "mg": "ミリグラム", "l": "リットル", "ml": "ミリリットル", "km/h": "キロメートル毎時",
        "mph": "マイル毎時", "m/s": "メートル毎秒", "kwh": "キロワット時", "kw": "キロワット", "w": "ワット",
        "v": "ボルト", "gb": "ギガバイト", "mb": "メガバイト", "tb": "テラバイト", "h": "時間", "min": "分", "s": "秒",
        "ms": "ミリ秒", "mi": "マイル", "ft": "フィート", "lb": "ポンド", "lbs": "ポンド", "oz": "オンス",
        "m²": "平方メートル", "km²": "平方キロメートル", "m³": "立方メートル",
    },
    "korean": {
        "km": "킬로미터", "m": "미터", "cm": "센티미터", "mm": "밀리미터", "kg": "킬로그램", "g": "그램",
        "mg": "밀리그램", "l": "리터", "ml": "밀리리터", "km/h": "킬로미터 매시", "mph": "마일 매시",
        "m/s": "미터 매초", "kwh": "킬로와트시", "kw": "킬로와트", "w": "와트", "v": "볼트", "gb": "기가바이트",
        "mb": "메가바이트", "tb": "테라바이트", "h": "시간", "min": "분", "s": "초", "ms": "밀리초", "mi": "마일",
        "ft": "피트", "lb": "파운드", "lbs": "파운드", "oz": "온스", "m²": "제곱미터", "km²": "제곱킬로미터",
        "m³": "세제곱미터",
    },
}

# Currency names: "unit forms", "subunit forms" (None: amounts are read as decimals).
_CURRENCIES: dict[str, dict[str, tuple[str, str | None]]] = {
    "english": {
        "EUR": ("euro|euros", "cent|cents"), "USD": ("dollar|dollars", "cent|cents"),
        "GBP": ("pound|pounds", "penny|pence"), "CHF": ("Swiss franc|Swiss francs", "centime|centimes"),
        "JPY": ("yen|yen", None), "CNY": ("yuan|yuan", None), "KRW": ("won|won", None),
        "RUB": ("ruble|rubles", "kopek|kopeks"), "INR": ("rupee|rupees", None),
    },
    "german": {
        "EUR": ("Euro|Euro", "Cent|Cent"), "USD": ("Dollar|Dollar", "Cent|Cent"), "GBP": ("Pfund|Pfund", "Penny|Pence"),
        "CHF": ("Franken|Franken", "Rappen|Rappen"), "JPY": ("Yen|Yen", None), "CNY": ("Yuan|Yuan", None),
        "KRW": ("Won|Won", None), "RUB": ("Rubel|Rubel", "Kopeke|Kopeken"), "INR": ("Rupie|Rupien", None),
    },
    "french": {
        "EUR": ("euro|euros", "centime|centimes"), "USD": ("dollar|dollars", "cent|cents"),
        "GBP": ("livre|livres", "penny|pence"), "CHF": ("franc suisse|francs suisses", "centime|centimes"),
        "JPY": ("yen|yens", None), "CNY": ("yuan|yuans", None), "KRW": ("won|wons", None),
        "RUB": ("rouble|roubles", "kopeck|kopecks"), "INR": ("roupie|roupies", None),
    },
    "spanish": {
        "EUR": ("euro|euros", "céntimo|céntimos"), "USD": ("dólar|dólares", "centavo|centavos"),
        "GBP": ("libra|libras", "penique|peniques"), "CHF": ("franco suizo|francos suizos", "céntimo|céntimos"),
        "JPY": ("yen|yenes", None), "CNY": ("yuan|yuanes", None), "KRW": ("won|wones", None),
        "RUB": ("rublo|rublos", "kopek|kopeks"), "INR": ("rupia|rupias", None),
    },
    "italian": {
        "EUR": ("euro|euro", "centesimo|centesimi"), "USD": ("dollaro|dollari", "centesimo|centesimi"),
        "GBP": ("sterlina|sterline", "penny|pence"), "CHF": ("franco svizzero|franchi svizzeri", "centesimo|centesimi"),
        "JPY": ("yen|yen", None), "CNY": ("yuan|yuan", None), "KRW": ("won|won", None),
        "RUB": ("rublo|rubli", "copeco|copechi"), "INR": ("rupia|rupie", None),
    },
    "portuguese": {
        "EUR": ("euro|euros", "cêntimo|cêntimos"), "USD": ("dólar|dólares", "centavo|centavos"),
        "GBP": ("libra|libras", "pêni|pence"), "CHF": ("franco suíço|francos suíços", "cêntimo|cêntimos"),
        "JPY": ("iene|ienes", None), "CNY": ("yuan|yuans", None), "KRW": ("won|wons", None),
        "RUB": ("rublo|rublos", "copeque|copeques"), "INR": ("rupia|rupias", None), "BRL": ("real|reais", "centavo|centavos"),
    },
    "russian": {
        "EUR": ("евро|евро|евро", "цент|цента|центов"), "USD": ("доллар|доллара|долларов", "цент|цента|центов"),
        "GBP": ("фунт|фунта|фунтов", "пенс|пенса|пенсов"), "CHF": ("франк|франка|франков", "сантим|сантима|сантимов"),
        "JPY": ("иена|иены|иен", None), "CNY": ("юань|юаня|юаней", None), "KRW": ("вона|воны|вон", None),
        "RUB": ("рубль|рубля|рублей", "копейка|копейки|копеек"), "INR": ("рупия|рупии|рупий", None),
    },
    "chinese": {
        "EUR": ("欧元", None), "USD": ("美元", None), "GBP": ("英镑", None), "CHF": ("瑞士法郎", None),
        "JPY": ("日元", None), "CNY": ("元", None), "KRW": ("韩元", None), "RUB": ("卢布", None), "INR": ("卢比", None),
    },
    "japanese": {
        "EUR": ("ユーロ", None), "USD": ("ドル", None), "GBP": ("ポンド", None), "CHF": ("スイスフラン", None),
        "JPY": ("円", None), "CNY": ("元", None), "KRW": ("ウォン", None), "RUB": ("ルーブル", None), "INR": ("ルピー", None),
    },
    "korean": {
        "EUR": ("유로", None), "USD": ("달러", None), "GBP": ("파운드", None), "CHF": ("스위스 프랑", None),
        "JPY": ("엔", None), "CNY": ("위안", None), "KRW": ("원", None), "RUB": ("루블", None), "INR": ("루피", None),
    },
}

# Symbols and codes LLMs write for currencies.  The yen sign is yuan in Chinese text.
CURRENCY_SYMBOLS: dict[str, str] = {"$": "USD", "US$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₩": "KRW", "₽": "RUB", "₹": "INR", "R$": "BRL"}
CURRENCY_CODES = frozenset(["USD", "EUR", "GBP", "JPY", "CNY", "RMB", "CHF", "KRW", "RUB", "INR", "BRL"])

_MONTHS: dict[str, str] = {
    "english": "January February March April May June July August September October November December",
    "german": "Januar Februar März April Mai Juni Juli August September Oktober November Dezember",
    "french": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre",
    "spanish": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre",
    "italian": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre dicembre",
    "portuguese": "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro dezembro",
    # Genitive: the form a date uses ("3 мая").
    "russian": "января февраля марта апреля мая июня июля августа сентября октября ноября декабря",
}


# Abbreviations read out in full.  Their dots are not sentence ends either (stream.py).
_ABBREVIATIONS: dict[str, dict[str, str]] = {
    "english": {
        "e.g.": "for example", "i.e.": "that is", "etc.": "et cetera", "Dr.": "Doctor", "Mr.": "Mister",
        "Mrs.": "Missus", "Prof.": "Professor", "vs.": "versus", "approx.": "approximately", "Jr.": "Junior",
    },
    "german": {
        "z. B.": "zum Beispiel", "z.B.": "zum Beispiel", "d. h.": "das heißt", "d.h.": "das heißt",
        "u. a.": "unter anderem", "bzw.": "beziehungsweise", "usw.": "und so weiter", "ca.": "circa",
        "evtl.": "eventuell", "ggf.": "gegebenenfalls", "inkl.": "inklusive", "zzgl.": "zuzüglich",
        "Nr.": "Nummer", "Str.": "Straße", "Tel.": "Telefon", "Mio.": "Millionen", "Mrd.": "Milliarden",
        "Dr.": "Doktor", "Prof.": "Professor", "bspw.": "beispielsweise", "etc.": "et cetera",
    },
    "french": {
        "p. ex.": "par exemple", "M.": "Monsieur", "Mme": "Madame", "Mlle": "Mademoiselle", "etc.": "et cetera",
        "env.": "environ", "Dr": "Docteur", "n°": "numéro", "N°": "numéro",
    },
    "spanish": {
        "p. ej.": "por ejemplo", "Sr.": "señor", "Sra.": "señora", "Dr.": "doctor", "Dra.": "doctora",
        "etc.": "etcétera", "aprox.": "aproximadamente", "Ud.": "usted", "Uds.": "ustedes", "núm.": "número",
    },
    "italian": {"ecc.": "eccetera", "Sig.": "signor", "Sig.ra": "signora", "Dott.": "dottor", "ad es.": "ad esempio"},
    "portuguese": {
        "p. ex.": "por exemplo", "Sr.": "senhor", "Sra.": "senhora", "Dr.": "doutor", "etc.": "etcétera",
        "aprox.": "aproximadamente",
    },
    "russian": {"т. е.": "то есть", "т.е.": "то есть", "т. д.": "так далее", "т.д.": "так далее",
                "т. п.": "тому подобное", "т.п.": "тому подобное", "руб.": "рублей"},
    "chinese": {},
    "japanese": {},
    "korean": {},
}


@dataclass(frozen=True)
class Lexicon:
    language: str
    decimal_mark: str  # "." or ","
    group_marks: str  # characters that may separate groups of three digits
    point: str  # the word read for the decimal mark
    minus: str
    plus: str
    percent: str  # forms; Chinese reads it before the number (see numbers.py)
    degree: str  # forms
    celsius: str
    fahrenheit: str
    range_word: str  # "5–10"
    dot: str  # in a host name
    at: str  # in an e-mail address
    and_word: str  # "&"
    number_word: str  # "#1"; empty: the sign is dropped
    months: tuple[str, ...] = ()
    units: dict[str, str] = field(default_factory=dict)
    currencies: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    abbreviations: dict[str, str] = field(default_factory=dict)
    # Joins "{amount} {unit}" (a space in most languages, nothing in Chinese and Japanese).
    space: str = " "

    def form(self, forms: str, count: int, fraction: bool = False) -> str:
        """The form of "a|b[|c]" that goes with `count` (a decimal number when `fraction`)."""
        options = forms.split("|")
        return options[min(plural_index(self.language, count, fraction), len(options) - 1)]


def plural_index(language: str, count: int, fraction: bool = False) -> int:
    """0: singular (or "one"), 1: plural (or Russian "few"), 2: Russian "many"."""
    n = abs(count)
    if language == "russian":
        if fraction:
            return 1  # a decimal takes the genitive singular: "1,5 километра"
        if n % 10 == 1 and n % 100 != 11:
            return 0
        return 1 if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14 else 2
    if language == "french":
        return 0 if n < 2 and not fraction else 1
    return 0 if n == 1 and not fraction else 1


def _lexicon(language: str, **words: str) -> Lexicon:
    months = tuple(_MONTHS.get(language, "").split())
    return Lexicon(
        language=language, months=months, units=_UNITS[language], currencies=_CURRENCIES[language],
        abbreviations=_ABBREVIATIONS[language], **words
    )


LEXICONS: dict[str, Lexicon] = {
    lex.language: lex
    for lex in (
        _lexicon(
            "english", decimal_mark=".", group_marks=",", point="point", minus="minus", plus="plus",
            percent="percent|percent", degree="degree|degrees", celsius="Celsius", fahrenheit="Fahrenheit",
            range_word="to", dot="dot", at="at", and_word="and", number_word="number",
        ),
        _lexicon(
            "german", decimal_mark=",", group_marks=".\u00a0\u202f", point="Komma", minus="minus", plus="plus",
            percent="Prozent|Prozent", degree="Grad|Grad", celsius="Celsius", fahrenheit="Fahrenheit",
            range_word="bis", dot="Punkt", at="at", and_word="und", number_word="Nummer",
        ),
        _lexicon(
            "french", decimal_mark=",", group_marks=" \u00a0\u202f.", point="virgule", minus="moins", plus="plus",
            percent="pour cent|pour cent", degree="degré|degrés", celsius="Celsius", fahrenheit="Fahrenheit",
            range_word="à", dot="point", at="arobase", and_word="et", number_word="numéro",
        ),
        _lexicon(
            "spanish", decimal_mark=",", group_marks=".\u00a0\u202f", point="coma", minus="menos", plus="más",
            percent="por ciento|por ciento", degree="grado|grados", celsius="centígrados", fahrenheit="Fahrenheit",
            range_word="a", dot="punto", at="arroba", and_word="y", number_word="número",
        ),
        _lexicon(
            "italian", decimal_mark=",", group_marks=".\u00a0\u202f", point="virgola", minus="meno", plus="più",
            percent="per cento|per cento", degree="grado|gradi", celsius="centigradi", fahrenheit="Fahrenheit",
            range_word="a", dot="punto", at="chiocciola", and_word="e", number_word="numero",
        ),
        _lexicon(
            "portuguese", decimal_mark=",", group_marks=".\u00a0\u202f", point="vírgula", minus="menos", plus="mais",
            percent="por cento|por cento", degree="grau|graus", celsius="Celsius", fahrenheit="Fahrenheit",
            range_word="a", dot="ponto", at="arroba", and_word="e", number_word="número",
        ),
        _lexicon(
            "russian", decimal_mark=",", group_marks=" \u00a0\u202f", point="запятая", minus="минус", plus="плюс",
            percent="процент|процента|процентов", degree="градус|градуса|градусов", celsius="по Цельсию",
            fahrenheit="по Фаренгейту", range_word="до", dot="точка", at="собака", and_word="и", number_word="номер",
        ),
        _lexicon(
            "chinese", decimal_mark=".", group_marks=",", point="点", minus="负", plus="正", percent="百分之",
            degree="度", celsius="摄氏度", fahrenheit="华氏度", range_word="到", dot="点", at="艾特", and_word="和",
            number_word="", space="",
        ),
        _lexicon(
            "japanese", decimal_mark=".", group_marks=",", point="点", minus="マイナス", plus="プラス",
            percent="パーセント", degree="度", celsius="度", fahrenheit="度", range_word="から", dot="ドット",
            at="アット", and_word="と", number_word="", space="",
        ),
        _lexicon(
            "korean", decimal_mark=".", group_marks=",", point="점", minus="마이너스", plus="플러스", percent="퍼센트",
            degree="도", celsius="도", fahrenheit="도", range_word="에서", dot="닷", at="골뱅이", and_word="와",
            number_word="",
        ),
    )
}
