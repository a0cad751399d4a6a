"""Replies as an LLM writes them for Home Assistant's streaming TTS, in several languages: Markdown, numbers,
abbreviations, units, emoji and code, for the tests of sentence splitting and streamed text."""

from __future__ import annotations

REPLIES = {
    "english": (
        "## Your morning\n\nGood morning! It's **21.5°C** in the living room 🌡️.\n\n"
        "1. Call Dr. Smith at 5 p.m. today (e.g. about the 3rd invoice).\n"
        "2. Buy 2 l of milk for $3.50 at www.example.com/shop.\n"
        "- The U.S. office opens on May 3, 2024.\n\n"
        "| Room | Temp |\n|---|---|\n| Kitchen | 19 °C |\n| Bath | 23.5 °C |\n\n"
        "```yaml\nservice: light.turn_on\n```\nThat's all. Anything else? 😊"
    ),
    "german": (
        "# Wetter heute\n\nDas ist z. B. ein Test. Wir treffen uns am 3. Mai in Berlin. "
        "Der 2. Platz geht an Nr. 5 hier. Es kostet 3.5 Euro oder 1.000,50 €, d. h. ca. 12 % mehr.\n\n"
        "- **Erstens:** 21 °C\n- Zweitens: 14:30 Uhr\n> Hinweis: bzw. morgen -3 °C.\n"
        "```python\nprint('x. Y')\n```\nFertig. Bis bald! 👋"
    ),
    "french": (
        "**Bonjour !** Le 1er mai, M. Dupont paie 2 500,50 €, p. ex. à 14h30. "
        "Il fait 18 °C.\n\n* Première étape : 3 km\n* Deuxième étape : 12,5 km\nC'est tout."
    ),
    "spanish": (
        "¡Hola! El Sr. García paga 1.249,99 € el 15/06/2024. Hace 25 °C, p. ej. en Madrid.\n\n"
        "1. Primero: 2 kg\n2. Segundo: 3,5 l\n¡Listo!"
    ),
    "chinese": "## 今日天气\n\n客厅现在是21.5°C，湿度45%。明天降温到-3°C！\n\n- 买2个苹果\n- 花费¥25.5\n详情见https://example.com。",
    "japanese": "**天気**\n\nリビングは21.5°Cです。明日は-3°Cになります！\n\n1. 牛乳を2本買う\n2. ¥1,280を払う\n以上です。",
    "russian": "Сегодня 21,5 °C, т. е. тепло. Встреча 3 мая в 14:30.\n\n- Купить 2 кг яблок\n- Заплатить 1 249,99 ₽",
}
