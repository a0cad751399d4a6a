"""The agent: the user's text, split at "|", is the reply's deltas. Every delta but the last goes out at once;
the last waits for the event `q3t_streaming_agent_release` (at most RELEASE_TIMEOUT seconds). The event
`q3t_streaming_agent_holding` says the agent is waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Literal

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import MATCH_ALL
from homeassistant.core import Event, HomeAssistant, callback
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

RELEASE_EVENT = "q3t_streaming_agent_release"
HOLDING_EVENT = "q3t_streaming_agent_holding"
RELEASE_TIMEOUT = 120


async def async_setup_entry(
    hass: HomeAssistant, entry: ConfigEntry, add_entities: AddConfigEntryEntitiesCallback
) -> None:
    add_entities([StreamingAgent(entry)])


class StreamingAgent(conversation.ConversationEntity):
    _attr_has_entity_name = True
    _attr_name = "Streaming test agent"
    _attr_supports_streaming = True

    def __init__(self, entry: ConfigEntry) -> None:
        self._attr_unique_id = entry.entry_id

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        return MATCH_ALL

    async def _async_handle_message(
        self, user_input: conversation.ConversationInput, chat_log: conversation.ChatLog
    ) -> conversation.ConversationResult:
        async for _content in chat_log.async_add_delta_content_stream(self.entity_id, self._deltas(user_input.text)):
            pass
        return conversation.async_get_result_from_chat_log(user_input, chat_log)

    async def _deltas(self, text: str) -> AsyncGenerator[dict[str, Any]]:
        *first, last = text.split("|")
        released = asyncio.Event()

        @callback
        def release(_event: Event) -> None:
            released.set()

        unsubscribe = self.hass.bus.async_listen(RELEASE_EVENT, release)
        try:
            yield {"role": "assistant"}
            for part in first:
                yield {"content": part}
                await asyncio.sleep(0)  # one delta at a time, as a model's tokens come
            self.hass.bus.async_fire(HOLDING_EVENT, {"sent": len(first), "held": last})
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await released.wait()
            yield {"content": last}
        finally:
            unsubscribe()
