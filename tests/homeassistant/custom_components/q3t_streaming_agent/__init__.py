"""A conversation agent and a speaker for tests/homeassistant/test_homeassistant.py. The agent answers as a streaming LLM
does: its reply arrives in deltas, and the last delta is held back until the test fires the event
`q3t_streaming_agent_release` (over HA's REST API), so the test can see our server speaking the first sentences
while the reply is still being written. The speaker keeps what `tts.speak` asked it to play."""

from __future__ import annotations

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant

PLATFORMS = [Platform.CONVERSATION, Platform.MEDIA_PLAYER]


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_unload_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
