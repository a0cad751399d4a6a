"""The text front end, table-driven: real-looking LLM replies per language -> the words spoken.

Each row is one sentence as an assistant writes it (Markdown, emoji, links, numbers with the
language's separators, negatives, large numbers, dates, times, currencies, percentages,
temperatures, units) and what the voice should say.  Below the table: the pieces on their own.
"""

from __future__ import annotations

import time

import pytest

from wyoming_qwen3tts.text import detect_language, speakable
from wyoming_qwen3tts.text.markdown import MarkdownBlocks, inline_text
from wyoming_qwen3tts.text.stream import SpokenSentences, spoken_sentences
from wyoming_qwen3tts.text.symbols import drop_symbols, shorten_links
from wyoming_qwen3tts.text.words import cardinal, decimal, korean_native, ordinal, year

REPLIES = [
    # -- english -----------------------------------------------------------------------------------
    (
        "english",
        "**Sure!** The living room is at 21.5°C and the humidity is 45%.",
        "Sure! The living room is at twenty-one point five degrees Celsius and the humidity is forty-five percent.",
    ),
    (
        "english",
        "Your flight leaves on 2024-06-15 at 7:45 AM from gate B12 🛫.",
        "Your flight leaves on June fifteenth, twenty twenty-four at seven forty-five A M from gate B12.",
    ),
    (
        "english",
        "The new thermostat costs $1,249.99, about 12% less than last year.",
        "The new thermostat costs one thousand two hundred and forty-nine dollars and ninety-nine cents, about twelve percent less than last year.",
    ),
    (
        "english",
        "It's -3°F outside, so wear a coat! ❄️🧥",
        "It's minus three degrees Fahrenheit outside, so wear a coat!",
    ),
    (
        "english",
        "Check [the docs](https://www.home-assistant.io/docs/automation/) or email support@nabucasa.com.",
        "Check the docs or email support at nabucasa dot com.",
    ),
    (
        "english",
        "The population is 8,336,817 and the area is 783.8 km².",
        "The population is eight million three hundred and thirty-six thousand eight hundred and seventeen and the area is seven hundred and eighty-three point eight square kilometers.",
    ),
    (
        "english",
        "Drive 15 mi at 55 mph; it takes about 20 min.",
        "Drive fifteen miles at fifty-five miles per hour; it takes about twenty minutes.",
    ),
    (
        "english",
        "The 3rd floor has 2 bedrooms and a 1.5 m wide window.",
        "The third floor has two bedrooms and a one point five meters wide window.",
    ),
    (
        "english",
        "Use `light.turn_on` with a brightness of 80%.",
        "Use light.turn on with a brightness of eighty percent.",
    ),
    (
        "english",
        "Meet Dr. Smith on May 3, 2024 at 10 a.m. in room #4.",
        "Meet Doctor Smith on May third, twenty twenty-four at ten A M. in room number four.",
    ),
    (
        "english",
        "The battery holds 13.5 kWh and the panels make 6 kW.",
        "The battery holds thirteen point five kilowatt hours and the panels make six kilowatts.",
    ),
    (
        "english",
        "Temperatures range from 10–15 °C this week.",
        "Temperatures range from ten to fifteen degrees Celsius this week.",
    ),
    # -- german ------------------------------------------------------------------------------------
    (
        "german",
        "**Gerne!** Im Wohnzimmer sind es 21,5 °C bei 45 % Luftfeuchtigkeit.",
        "Gerne! Im Wohnzimmer sind es einundzwanzig Komma fünf Grad Celsius bei fünfundvierzig Prozent Luftfeuchtigkeit.",
    ),
    (
        "german",
        "Am 15.06.2024 um 7:45 Uhr geht dein Flug 🛫.",
        "Am fünfzehnten Juni zweitausendvierundzwanzig um sieben Uhr fünfundvierzig geht dein Flug.",
    ),
    (
        "german",
        "Der neue Thermostat kostet 1.249,99 €, also etwa 12 % weniger.",
        "Der neue Thermostat kostet tausendzweihundertneunundvierzig Euro und neunundneunzig Cent, also etwa zwölf Prozent weniger.",
    ),
    (
        "german",
        "Draußen sind es -3 °C, zieh dir eine Jacke an! ❄️",
        "Draußen sind es minus drei Grad Celsius, zieh dir eine Jacke an!",
    ),
    (
        "german",
        "Mehr dazu unter https://www.home-assistant.io/docs/ oder per Mail an info@beispiel.de.",
        "Mehr dazu unter home-assistant Punkt io oder per Mail an info at beispiel Punkt de.",
    ),
    (
        "german",
        "Berlin hat 3.755.251 Einwohner auf 891,1 km².",
        "Berlin hat drei Millionen siebenhundertfünfundfünfzigtausendzweihunderteinundfünfzig Einwohner auf achthunderteinundneunzig Komma eins Quadratkilometer.",
    ),
    (
        "german",
        "Die Fahrt dauert ca. 20 Min. bei 120 km/h.",
        "Die Fahrt dauert circa zwanzig Minuten bei hundertzwanzig Kilometer pro Stunde.",
    ),
    (
        "german",
        "Der 3. Platz geht an Nr. 7, z. B. am 1. Mai.",
        "Der dritte Platz geht an Nummer sieben, zum Beispiel am ersten Mai.",
    ),
    (
        "german",
        "Die Batterie speichert 13,5 kWh bei 230 V.",
        "Die Batterie speichert dreizehn Komma fünf Kilowattstunden bei zweihundertdreißig Volt.",
    ),
    (
        "german",
        "Es kostet 3.5 Euro, also 2-3 Tage Arbeit im Jahr 1999.",
        "Es kostet drei Komma fünf Euro, also zwei bis drei Tage Arbeit im Jahr neunzehnhundertneunundneunzig.",
    ),
    # -- french ------------------------------------------------------------------------------------
    (
        "french",
        "**Bien sûr !** Il fait 21,5 °C dans le salon avec 45 % d'humidité.",
        "Bien sûr ! Il fait vingt et un virgule cinq degrés Celsius dans le salon avec quarante-cinq pour cent d'humidité.",
    ),
    (
        "french",
        "Votre vol part le 15/06/2024 à 7h45 🛫.",
        "Votre vol part le quinze juin deux mille vingt-quatre à sept heures quarante-cinq.",
    ),
    (
        "french",
        "Le thermostat coûte 1 249,99 €, soit 12 % de moins.",
        "Le thermostat coûte mille deux cent quarante-neuf euros et quatre-vingt-dix-neuf centimes, soit douze pour cent de moins.",
    ),
    (
        "french",
        "Il fait -3 °C dehors, prenez un manteau ! ❄️",
        "Il fait moins trois degrés Celsius dehors, prenez un manteau !",
    ),
    (
        "french",
        "Voir https://www.home-assistant.io/docs/ ou écrire à contact@exemple.fr.",
        "Voir home-assistant point io ou écrire à contact arobase exemple point fr.",
    ),
    (
        "french",
        "Paris compte 2 102 650 habitants sur 105,4 km².",
        "Paris compte deux millions cent deux mille six cent cinquante habitants sur cent cinq virgule quatre kilomètres carrés.",
    ),
    (
        "french",
        "Le 1er mai, c'est la 2e fois que M. Dupont court 10 km.",
        "Le premier mai, c'est la deuxième fois que Monsieur Dupont court dix kilomètres.",
    ),
    # -- spanish -----------------------------------------------------------------------------------
    (
        "spanish",
        "**¡Claro!** En el salón hay 21,5 °C y un 45 % de humedad.",
        "¡Claro! En el salón hay veintiuno coma cinco grados centígrados y un cuarenta y cinco por ciento de humedad.",
    ),
    (
        "spanish",
        "Tu vuelo sale el 15/06/2024 a las 7:45 🛫.",
        "Tu vuelo sale el quince de junio de dos mil veinticuatro a las siete y cuarenta y cinco.",
    ),
    (
        "spanish",
        "El termostato cuesta 1.249,99 €, un 12 % menos.",
        "El termostato cuesta mil doscientos cuarenta y nueve euros con noventa y nueve céntimos, un doce por ciento menos.",
    ),
    ("spanish", "Hace -3 °C fuera, ¡abrígate! ❄️", "Hace menos tres grados centígrados fuera, ¡abrígate!"),
    (
        "spanish",
        "Consulta https://www.home-assistant.io/docs/ o escribe a hola@ejemplo.es.",
        "Consulta home-assistant punto io o escribe a hola arroba ejemplo punto es.",
    ),
    (
        "spanish",
        "Madrid tiene 3.332.035 habitantes y 604,3 km².",
        "Madrid tiene tres millones trescientos treinta y dos mil treinta y cinco habitantes y seiscientos cuatro coma tres kilómetros cuadrados.",
    ),
    (
        "spanish",
        "Es la 2ª vez que el Sr. García gana el 1º premio.",
        "Es la segunda vez que el señor García gana el primer premio.",
    ),
    # -- chinese -----------------------------------------------------------------------------------
    ("chinese", "**好的！**客厅现在是21.5°C，湿度45%。", "好的！客厅现在是二十一点五摄氏度，湿度百分之四十五。"),
    ("chinese", "你的航班在2024年6月15日7:45起飞🛫。", "你的航班在二零二四年六月十五日七点四十五分起飞。"),
    ("chinese", "新的温控器售价¥1,249.99，便宜了12%。", "新的温控器售价一千二百四十九点九九元，便宜了百分之十二。"),
    ("chinese", "外面是-3°C，记得穿外套！❄️", "外面是零下三摄氏度，记得穿外套！"),
    ("chinese", "详情请看https://www.home-assistant.io/docs/。", "详情请看home-assistant 点 io。"),
    (
        "chinese",
        "北京有21,893,095人，面积16,410.54km²。",
        "北京有二千一百八十九万三千零九十五人，面积一万六千四百一十点五四平方公里。",
    ),
    ("chinese", "我买了2个苹果和3本书，一共花了$25。", "我买了两个苹果和三本书，一共花了二十五美元。"),
    # -- japanese ----------------------------------------------------------------------------------
    (
        "japanese",
        "**もちろん！**リビングは21.5°Cで、湿度は45%です。",
        "もちろん！リビングは二十一点五度で、湿度は四十五パーセントです。",
    ),
    (
        "japanese",
        "フライトは2024年6月15日の7:45に出発します🛫。",
        "フライトは二千二十四年六月十五日の七時四十五分に出発します。",
    ),
    (
        "japanese",
        "新しいサーモスタットは¥12,800で、12%安くなりました。",
        "新しいサーモスタットは一万二千八百円で、十二パーセント安くなりました。",
    ),
    ("japanese", "外は-3°Cなので、コートを着てください！❄️", "外はマイナス三度なので、コートを着てください！"),
    ("japanese", "東京の人口は14,047,594人です。", "東京の人口は千四百四万七千五百九十四人です。"),
    (
        "japanese",
        "詳しくはhttps://www.home-assistant.io/docs/をご覧ください。",
        "詳しくはhome-assistant ドット ioをご覧ください。",
    ),
    # -- korean ------------------------------------------------------------------------------------
    (
        "korean",
        "거실 온도는 21.5°C이고 습도는 45%입니다.",
        "거실 온도는 이십일 점 오 도이고 습도는 사십오 퍼센트입니다.",
    ),
    (
        "korean",
        "비행기는 2024년 6월 15일 7:45에 출발합니다 🛫.",
        "비행기는 이천이십사년 유월 십오일 일곱 시 사십오 분에 출발합니다.",
    ),
    (
        "korean",
        "새 온도 조절기는 ₩129,000이고 사과 3개가 있어요.",
        "새 온도 조절기는 십이만 구천 원이고 사과 세 개가 있어요.",
    ),
    # -- russian -----------------------------------------------------------------------------------
    (
        "russian",
        "В гостиной 21,5 °C и влажность 45 %.",
        "В гостиной двадцать одна целая пять десятых градуса по Цельсию и влажность сорок пять процентов.",
    ),
    (
        "russian",
        "Ваш рейс 15 июня 2024 года в 7:45 🛫.",
        "Ваш рейс пятнадцатое июня две тысячи двадцать четвёртого года в семь сорок пять.",
    ),
    (
        "russian",
        "Термостат стоит 1 249,99 ₽, то есть на 12 % дешевле.",
        "Термостат стоит одна тысяча двести сорок девять рублей девяносто девять копеек, то есть на двенадцать процентов дешевле.",
    ),
    # -- italian -----------------------------------------------------------------------------------
    (
        "italian",
        "In soggiorno ci sono 21,5 °C e il 45 % di umidità.",
        "In soggiorno ci sono ventuno virgola cinque gradi centigradi e il quarantacinque per cento di umidità.",
    ),
    (
        "italian",
        "Il termostato costa 1.249,99 €, il 12 % in meno.",
        "Il termostato costa milleduecentoquarantanove euro e novantanove centesimi, il dodici per cento in meno.",
    ),
    (
        "italian",
        "Il tuo volo parte il 15/06/2024 alle 7:45 🛫.",
        "Il tuo volo parte il quindici giugno duemilaventiquattro alle sette e quarantacinque.",
    ),
    # -- portuguese --------------------------------------------------------------------------------
    (
        "portuguese",
        "Na sala estão 21,5 °C e 45 % de umidade.",
        "Na sala estão vinte e um vírgula cinco graus Celsius e quarenta e cinco por cento de umidade.",
    ),
    (
        "portuguese",
        "O termostato custa R$ 1.249,99, 12 % a menos.",
        "O termostato custa mil duzentos e quarenta e nove reais e noventa e nove centavos, doze por cento a menos.",
    ),
    (
        "portuguese",
        "Seu voo sai em 15/06/2024 às 7:45 🛫.",
        "Seu voo sai em quinze de junho de dois mil e vinte e quatro às sete e quarenta e cinco.",
    ),
]


@pytest.mark.parametrize(("language", "written", "spoken"), REPLIES)
def test_reply_as_spoken(language, written, spoken):
    assert speakable(written, language) == spoken


def test_table_covers_the_six_languages_asked_for_and_all_ten():
    languages = {language for language, _, _ in REPLIES}
    assert {"english", "german", "french", "spanish", "chinese", "japanese"} <= languages
    assert len(languages) == 10


def test_no_digit_survives_outside_names():
    """Digits left in the spoken text are the model's to misread; only names like "B12" keep them."""
    for language, written, spoken in REPLIES:
        left = [word.strip(".,!?") for word in spoken.split() if any(ch.isdigit() for ch in word)]
        assert left in ([], ["B12"]), (language, written, left)


def test_auto_language_follows_the_script():
    assert speakable("气温25°C。", "auto") == "气温二十五摄氏度。"
    assert (
        speakable("Es sind 25 °C und 3,5 % mehr.", "auto")
        == "Es sind fünfundzwanzig Grad Celsius und drei Komma fünf Prozent mehr."
    )
    assert speakable("It is 25 °C.", "auto") == "It is twenty-five degrees Celsius."


# -- numbers as words ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "零"),
        (10, "十"),
        (15, "十五"),
        (20, "二十"),
        (105, "一百零五"),
        (110, "一百一十"),
        (1005, "一千零五"),
        (10005, "一万零五"),
        (100000, "十万"),
        (21893095, "二千一百八十九万三千零九十五"),
        (100000000, "一亿"),
        (120034005, "一亿二千零三万四千零五"),
        (1000000000000, "一万亿"),
    ],
)
def test_chinese_cardinals(n, words):
    assert cardinal(n, "chinese") == words


def test_cardinals_are_spoken_forms():
    assert cardinal(1249, "english") == "one thousand two hundred and forty-nine"  # no written commas
    assert cardinal(1000, "german") == "tausend" and cardinal(100, "german") == "hundert"
    assert (
        cardinal(10**16, "english")
        == "one zero zero zero zero zero zero zero zero zero zero zero zero zero zero zero zero"
    )
    with pytest.raises(ValueError):
        cardinal(-1, "english")


@pytest.mark.parametrize(
    ("language", "whole", "fraction", "words"),
    [
        ("english", "3", "14", "three point one four"),
        ("german", "3", "14", "drei Komma eins vier"),
        ("french", "3", "05", "trois virgule zéro cinq"),
        ("spanish", "2", "50", "dos coma cincuenta"),
        ("italian", "0", "25", "zero virgola venticinque"),
        ("portuguese", "1", "5", "um vírgula cinco"),
        ("russian", "3", "25", "три целых двадцать пять сотых"),
        ("chinese", "3", "05", "三点零五"),
        ("japanese", "12", "5", "十二点五"),
        ("korean", "0", "5", "영 점 오"),
    ],
)
def test_decimals(language, whole, fraction, words):
    assert decimal(whole, fraction, language) == words


def test_years_and_ordinals():
    assert year(2024, "english") == "twenty twenty-four" and year(1905, "english") == "nineteen oh-five"
    assert (
        year(1999, "german") == "neunzehnhundertneunundneunzig" and year(2024, "german") == "zweitausendvierundzwanzig"
    )
    assert year(2024, "chinese") == "二零二四" and year(2024, "japanese") == "二千二十四"
    assert ordinal(21, "english") == "twenty-first" and ordinal(3, "chinese") == "三"


def test_korean_native_numbers_before_counters():
    assert [korean_native(n) for n in (1, 2, 3, 4, 14, 20, 21, 99)] == [
        "한",
        "두",
        "세",
        "네",
        "열네",
        "스무",
        "스물한",
        "아흔아홉",
    ]
    assert korean_native(0) is None and korean_native(100) is None
    assert speakable("1번째, 3시, 10월, 6월", "korean") == "첫 번째, 세 시, 시월, 유월"


@pytest.mark.parametrize(
    ("language", "written", "spoken"),
    [
        (
            "english",
            "In the 1990s, 4K TVs cost 3-4x more.",
            "In the nineteen nineties, four K TVs cost three to four x more.",
        ),
        ("english", "Call 0800 now.", "Call zero eight zero zero now."),
        ("english", "A $5 million grant.", "A five million dollars grant."),
        ("english", "It's 25:99 and 2:1.", "It's twenty-five:ninety-nine and two:one."),
        (
            "german",
            "Zum 100. Mal am 24.12.2024.",
            "Zum hundertsten Mal am vierundzwanzigsten Dezember zweitausendvierundzwanzig.",
        ),
        ("french", "La 1re et les 3èmes, 2 Go.", "La première et les troisième, deux gigaoctets."),
        (
            "russian",
            "21 км, 22 км и 25 км.",
            "двадцать один километр, двадцать два километра и двадцать пять километров.",
        ),
        ("chinese", "第3名，2024年，5~10度。", "第三名，二零二四年，五到十度。"),
    ],
)
def test_number_corners(language, written, spoken):
    assert speakable(written, language) == spoken


# -- symbols, links, Markdown ---------------------------------------------------------------


def test_emoji_sequences_go_whole():
    # ZWJ family, skin tone, flag, keycap, subdivision flag (tags), pictographs and dingbats
    text = "Hi 👨‍👩‍👧 👋🏽 🇩🇪 #️⃣ 🏴󠁧󠁢󠁳󠁣󠁴󠁿 ★ ✓ ☀️ ™ there"
    assert drop_symbols(text, "english") == "Hi there"


def test_arrows_bullets_and_ampersand():
    assert drop_symbols("Settings → Devices & Services", "english") == "Settings, Devices and Services"
    assert drop_symbols("Küche • Bad", "german") == "Küche, Bad"


@pytest.mark.parametrize(
    ("language", "written", "spoken"),
    [
        ("english", "See (https://github.com/home-assistant/core/issues?q=is%3Aopen).", "See (github dot com)."),
        ("english", "Go to www.example.org/path, then example.com.", "Go to example dot org, then example dot com."),
        (
            "english",
            "Mail first.last+tag@mail.example.co.uk now",
            "Mail first dot last+tag at mail dot example dot co dot uk now",
        ),
        ("german", "Siehe http://192.168.1.10:8123/config.", "Siehe 192 Punkt 168 Punkt 1 Punkt 10."),
    ],
)
def test_links_shortened(language, written, spoken):
    assert shorten_links(written, language) == spoken


def test_inline_markdown_to_words():
    assert inline_text("**Bold**, _it_, ~~old~~, `code`, [text](http://x.y) and ![alt](a.png) <b>tag</b> &amp;") == (
        "Bold, it, old, code, text and  tag &"
    )
    assert inline_text("no marks at all") == "no marks at all"


def test_markdown_blocks():
    text = (
        "# Title\n\n## Sub *title*\n> quoted - text\n> - quoted item\n- one\n* two\n+ three\n"
        "1. first\n12) twelfth\n---\n***\n```python\nprint('no')\n```\n~~~\nalso no\n~~~\n"
        "| Room | Temp |\n|:-----|-----:|\n| Bad | 21 °C |\n|  | 19 °C |\nafter\n-5 degrees\n#hashtag\n"
    )
    blocks = MarkdownBlocks()
    out = blocks.feed(text) + blocks.finish()
    lines = [line for line in out.split("\n") if line]
    assert lines == [
        "Title",
        "Sub *title*",
        "quoted - text",
        "quoted item",
        "one",
        "two",
        "three",
        "first",
        "twelfth",
        "Room: Bad, Temp: 21 °C.",
        "Temp: 19 °C.",
        "after",
        "-5 degrees",
        "#hashtag",
    ]


def test_unclosed_code_fence_is_never_read():
    blocks = MarkdownBlocks()
    assert blocks.feed("Before.\n```\nsecret()\nmore") + blocks.finish() == "Before.\n"


# -- language -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("今天天气很好。", "chinese"),
        ("今日はいい天気です。", "japanese"),
        ("東京タワー", "japanese"),
        ("오늘 날씨가 좋아요.", "korean"),
        ("Сегодня хорошая погода.", "russian"),
        ("Es ist kalt.", "german"),
        ("Il fait 18 degrés.", "french"),
        ("¿Qué tal?", "spanish"),
        ("Fa caldo oggi.", "italian"),
        ("Você está bem?", "portuguese"),
        ("The cat is here.", "english"),
        ("OK", "english"),
        ("", "english"),
    ],
)
def test_detect_language(text, language):
    assert detect_language(text) == language


def test_detect_language_keeps_the_default_without_evidence():
    assert detect_language("Tesla Model 3", default="german") == "german"
    assert detect_language("The weather is nice.", default="german") == "english"


def test_pathological_input_finishes():
    """Every pass is linear: long runs of the characters the patterns look for finish at once."""
    for text in (
        "1" * 20000,
        "1." * 10000,
        "1,000" * 4000,
        "*_" * 10000,
        "€1 " * 5000,
        "a@b." * 5000,
        "https://" * 3000,
    ):
        assert isinstance(speakable(text, "english"), str)


# Runs of the characters that line-start markers and sentence ends are made of, each cut into
# 3-character fragments as a stream would bring them. Before the fix a run of 30 dashes ending in a
# letter took minutes (exponential backtracking in the list/rule marker pattern).
_PATHOLOGICAL_STREAMS = (
    "-" * 5000 + "x end.",
    "- " * 2500 + "x",
    " " * 5000 + "x",
    "a. " * 1600,
    "3. " * 1600,
    "3." + " " * 4990 + "x",
    "1. " + "x" * 5000,
    "|" + "a|" * 2500,
    "`" * 5000,
    "Dr. " * 1250,
    "# " * 2500,
    "> " * 2500,
    "5. Mai " * 700,
)


@pytest.mark.parametrize("text", _PATHOLOGICAL_STREAMS, ids=lambda t: repr(t[:8]))
def test_pathological_streams_finish(text):
    """Whole and in fragments, 5,000 hostile characters go through the front end in well under a second
    (a few milliseconds measured; the bound leaves room for a slow CI machine)."""
    started = time.perf_counter()
    whole = spoken_sentences(text)
    stream = SpokenSentences()
    parts = [s for i in range(0, len(text), 3) for s in stream.feed(text[i : i + 3])] + stream.finish()
    assert [s.spoken for s in parts] == [s.spoken for s in whole]
    assert time.perf_counter() - started < 2.0
