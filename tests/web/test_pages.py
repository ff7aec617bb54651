"""The HTML UI's routes on the tiny model: pages, htmx partials, the bubble's SSE, errors."""

from __future__ import annotations

import asyncio
import re

import pytest
from litestar.testing import TestClient

from chatbox.chat import Busy, InvalidInput, Overloaded, TooLong, TurnRun
from chatbox.web.errors import classify
from chatbox.web.ui.helpers import friendly_message, ui_events
from tests.sse import Event, parse_sse

HX = {"HX-Request": "true"}


def stream_url(body: str) -> str:
    """The answer's SSE address: the streaming bubble's, or, where the tiny model finished
    before a whole page was rendered (the bubble is then final), the newest answer's."""
    match = re.search(r'sse-connect="([^"]+)"', body)
    if match:
        return match.group(1)
    answers = re.findall(r'class="turn assistant status-\w+" id="turn-([^"]+)"', body)
    conv = re.search(r'"/ui/c/(c_[^/"]+)/', body)
    assert answers and conv, body
    return f"/ui/c/{conv.group(1)}/turns/{answers[-1]}/stream"


def read_answer(client: TestClient, body: str) -> None:
    """Read a turn's answer to the end, if it is still streaming (the tiny model may have
    finished it before the page was rendered)."""
    match = re.search(r'sse-connect="([^"]+)"', body)
    if match:
        read_stream(client, match.group(1))


def read_stream(client: TestClient, url: str, last_id: int | None = None) -> list[Event]:
    headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
    response = client.get(url, headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    return list(parse_sse(iter(response.text.split("\n"))))


def start_chat(client: TestClient, text: str = "Hello there") -> tuple[str, str]:
    response = client.post(
        "/ui/new/send", data={"content": text, "model": "", "system_prompt": ""}, headers=HX
    )
    assert response.status_code == 200, response.text
    conv_id = response.headers["HX-Push-Url"].removeprefix("/c/")
    return conv_id, stream_url(response.text)


def send(client: TestClient, conv_id: str, text: str) -> list[Event]:
    """A message to an open chat through the UI form; the answer's stream events."""
    response = client.post(f"/ui/c/{conv_id}/send", headers=HX, data={"content": text})
    assert response.status_code == 200, response.text
    return read_stream(client, stream_url(response.text))


def test_index_is_a_new_chat_with_local_assets_only(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert 'hx-post="/ui/new/send"' in page
    # A model the catalogue does not describe (the tiny one) gets the general starters.
    assert re.findall(r'class="starter".*?<strong>([^<]+)</strong>', page) == [
        "Explain a concept",
        "Write some code",
        "Draft an email",
        "Plan a meal",
    ]
    assert "/static/vendor/htmx.min.js" in page and "/static/vendor/sse.js" in page
    assert not re.search(r'(src|href)="(https?:)?//', page), "no CDNs on an offline box"
    assert client.get("/static/app.css").status_code == 200
    assert client.get("/static/app.js").status_code == 200


def test_first_message_creates_the_chat_and_streams_html(client: TestClient) -> None:
    response = client.post("/ui/new/send", data={"content": "<b>hi</b> there"}, headers=HX)
    assert response.status_code == 200
    conv_id = response.headers["HX-Push-Url"].removeprefix("/c/")
    assert "&lt;b&gt;hi&lt;/b&gt; there" in response.text  # the user's text is escaped
    assert 'id="conv-list" hx-swap-oob="true"' in response.text
    events = read_stream(client, stream_url(response.text))
    kinds = [e.event for e in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) <= {"html"}
    ids = [int(e.id or 0) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    final = events[-1].data
    assert 'data-status="complete"' in final
    assert 'id="context-meter" hx-swap-oob="true"' in final

    page = client.get(f"/c/{conv_id}").text
    assert "&lt;b&gt;hi&lt;/b&gt; there" in page
    assert 'class="conv-item active"' in page
    assert 'data-status="complete"' in page
    assert "sse-connect" not in page  # nothing running any more
    assert read_stream(client, stream_url(page))[-1].data == final  # the final bubble again


def test_a_page_rendered_while_the_answer_ends_still_shows_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer ends while the new chat's page is being put together (after its turns
    were read): the page still shows it running, and its stream gives the final bubble; it
    must not show the question with no answer at all."""
    services = client.app.state.services
    summaries = services.store.summaries
    real = summaries.on_path

    async def read_late(conv_id: str, path_ids: list[str]) -> object:
        while conv_id in services.chat._runs:  # the turns were read; now the answer ends
            await asyncio.sleep(0.005)
        return await real(conv_id, path_ids)

    monkeypatch.setattr(summaries, "on_path", read_late)
    response = client.post("/ui/new/send", data={"content": "Hello there"}, headers=HX)
    assert response.status_code == 200, response.text
    # Running (as it nearly always is when the page starts), or already ended and written
    # (the tiny model is quick): either way the answer is on the page.
    assert re.search(r'class="turn assistant (streaming|status-complete)"', response.text)
    final = read_stream(client, stream_url(response.text))[-1]
    assert final.event == "done" and 'data-status="complete"' in final.data


def test_reconnect_with_last_event_id_resumes(client: TestClient) -> None:
    _, url = start_chat(client)
    read_stream(client, url)  # to the end
    events = read_stream(client, url)
    # Replaying a finished answer skips the steps: the final bubble holds the whole text.
    assert [e.event for e in events] == ["done"]
    done_id = int(events[-1].id or 0)
    # At least one event before done (the tiny model's tokens may arrive joined in a few).
    assert done_id >= 2
    middle = done_id // 2
    resumed = read_stream(client, url, last_id=middle)
    assert all(int(e.id or 0) > middle for e in resumed)
    assert resumed[-1].event == "done" and resumed[-1].data == events[-1].data
    again = read_stream(client, url, last_id=done_id)  # after the end: the end once more
    assert [(e.event, e.data) for e in again] == [("done", events[-1].data)]


def test_unknown_stream_ends_instead_of_reconnecting_forever(client: TestClient) -> None:
    events = read_stream(client, "/ui/c/c_nope/turns/t_nope/stream")
    assert [e.event for e in events] == ["done"]
    assert "no longer available" in events[0].data


def test_regenerate_and_switch_branches(client: TestClient) -> None:
    conv_id, url = start_chat(client, "Pick a number")
    first = read_stream(client, url)[-1].data
    answer_id = re.search(r'data-turn-id="([^"]+)"', first).group(1)  # type: ignore[union-attr]
    response = client.post(f"/ui/c/{conv_id}/turns/{answer_id}/regenerate", headers=HX)
    assert response.status_code == 200
    # A new answer (still streaming, or already done on the tiny model) replaces the old one.
    assert re.search(r'class="turn assistant (streaming|status-complete)"', response.text)
    assert answer_id not in response.text  # the old answer is on the other branch now
    read_answer(client, response.text)
    page = client.get(f"/c/{conv_id}").text
    assert '<span class="branch-pos">2/2</span>' in page
    response = client.post(f"/ui/c/{conv_id}/branch", data={"turn_id": answer_id}, headers=HX)
    assert response.status_code == 200
    assert '<span class="branch-pos">1/2</span>' in response.text
    assert answer_id in response.text


def test_edit_makes_a_sibling_of_the_user_message(client: TestClient) -> None:
    conv_id, url = start_chat(client, "First version")
    read_stream(client, url)
    page = client.get(f"/c/{conv_id}").text
    user_id = re.search(r'class="turn user" id="turn-([^"]+)"', page).group(1)  # type: ignore[union-attr]
    form = client.get(f"/ui/c/{conv_id}/turns/{user_id}/edit", headers=HX)
    assert "First version</textarea>" in form.text
    response = client.post(
        f"/ui/c/{conv_id}/turns/{user_id}/edit", data={"content": "Second version"}, headers=HX
    )
    assert response.status_code == 200
    assert "Second version" in response.text and "First version" not in response.text
    read_answer(client, response.text)
    assert '<span class="branch-pos">2/2</span>' in client.get(f"/c/{conv_id}").text


def test_settings_rename_model_and_system_prompt(client: TestClient) -> None:
    conv_id, url = start_chat(client)
    read_stream(client, url)
    response = client.post(
        f"/ui/c/{conv_id}/settings",
        headers=HX,
        data={"title": "Renamed chat", "system_prompt": "Be brief.", "model": "tiny"},
    )
    assert response.status_code == 200
    assert "Renamed chat</h1>" in response.text
    assert "Be brief.</textarea>" in response.text
    assert 'hx-swap-oob="true"' in response.text  # the sidebar shows the new title
    bad = client.post(f"/ui/c/{conv_id}/settings", data={"model": "nope"}, headers=HX)
    assert bad.status_code == 404 and bad.headers["HX-Retarget"] == "#alerts"
    assert "not available" in bad.text
    auto = client.post(f"/ui/c/{conv_id}/settings", headers=HX, data={"model": "auto"})
    assert '<option value="auto" selected' in auto.text
    assert '<option value="auto" selected' in client.get(f"/c/{conv_id}").text


def test_delete_redirects_home(client: TestClient) -> None:
    conv_id, url = start_chat(client)
    read_stream(client, url)
    response = client.post(f"/ui/c/{conv_id}/delete", headers=HX)
    assert response.headers["HX-Redirect"] == "/"
    assert client.get(f"/c/{conv_id}").status_code == 404


def test_errors_are_friendly_inline_alerts(client: TestClient) -> None:
    empty = client.post("/ui/new/send", data={"content": "   "}, headers=HX)
    assert empty.status_code == 422
    assert empty.headers["HX-Retarget"] == "#alerts"
    assert empty.headers["HX-Reswap"] == "innerHTML"
    assert 'role="alert"' in empty.text and "Type a message first" in empty.text
    conv_id, url = start_chat(client)
    read_stream(client, url)
    long = client.post(f"/ui/c/{conv_id}/send", data={"content": "x" * 200_001}, headers=HX)
    assert long.status_code == 413 and "too long" in long.text
    missing = client.get("/c/c_missing")
    assert missing.status_code == 404 and "<!doctype html>" in missing.text
    assert "no longer exists" in missing.text


def _friendly(exc: Exception) -> tuple[int, str, dict[str, str]]:
    problem = classify(exc)
    return problem.status, friendly_message(exc), problem.headers


def test_friendly_messages() -> None:
    status, message, headers = _friendly(Overloaded("queue full", retry_after=7))
    assert (status, headers) == (503, {"Retry-After": "7"}) and "7 seconds" in message
    assert _friendly(Busy("busy"))[0] == 409
    assert _friendly(TooLong(5000, 4096))[0] == 413
    assert _friendly(InvalidInput("the message is empty"))[1] == "Type a message first."


async def test_bubble_stream_resumes_mid_answer_with_the_whole_text() -> None:
    run = TurnRun("c_1", "t_2", "t_1", "tiny", "t_1", grace_s=1.0)
    run.publish("start", {"turn_id": "t_2"})
    run.publish("token", {"text": "Hel"})
    run.publish("token", {"text": "lo"})
    stream = ui_events(None, None, None, None, run, after=2)  # type: ignore[arg-type]
    first = list(parse_sse(iter((await anext(stream)).decode().split("\n"))))
    assert [(e.id, e.event, e.data) for e in first] == [("3", "html", "<p>Hello</p>\n")]
    run.publish("token", {"text": " **you**"})
    second = list(parse_sse(iter((await anext(stream)).decode().split("\n"))))
    assert second[0].id == "4" and "Hello <strong>you</strong>" in second[0].data
    await stream.aclose()


def search_href(client: TestClient, words: str) -> str:
    body = client.get("/ui/search", params={"q": words}, headers=HX).text
    match = re.search(r'href="(/c/[^"]+)"', body)
    assert match, body
    return match.group(1).replace("&amp;", "&")


def test_a_search_hit_on_an_old_branch_opens_that_branch(client: TestClient) -> None:
    conv_id, url = start_chat(client, "Tell me about aardvarks")
    read_stream(client, url)
    page = client.get(f"/c/{conv_id}").text
    user_id = re.search(r'class="turn user" id="turn-([^"]+)"', page).group(1)  # type: ignore[union-attr]
    response = client.post(
        f"/ui/c/{conv_id}/turns/{user_id}/edit",
        data={"content": "Tell me about pangolins"},
        headers=HX,
    )
    assert response.status_code == 200, response.text
    read_answer(client, response.text)
    bubble = '<div class="plain">Tell me about aardvarks</div>'
    assert bubble not in client.get(f"/c/{conv_id}").text  # now on the second branch
    path, anchor = search_href(client, "aardvarks").split("#")
    page = client.get(path).text
    assert f'id="{anchor}"' in page and bubble in page
    assert '<span class="branch-pos">1/2</span>' in page and "about pangolins<" not in page
    # A GET changes nothing: the active branch is still the second one ...
    assert bubble not in client.get(f"/c/{conv_id}").text
    # ... until a message is sent from the page showing the first: it continues that one.
    leaf = re.search(r'name="parent_id" value="([^"]+)"', page)
    assert leaf, page
    response = client.post(
        f"/ui/c/{conv_id}/send",
        headers=HX,
        data={"content": "More on aardvarks", "parent_id": leaf.group(1)},
    )
    assert response.status_code == 200, response.text
    read_stream(client, stream_url(response.text))
    now = client.get(f"/c/{conv_id}").text
    assert bubble in now and "More on aardvarks" in now and 'name="parent_id"' not in now


def test_a_search_hit_deep_in_a_long_chat_is_on_the_page(client: TestClient) -> None:
    conv_id, url = start_chat(client, "Remember the word quokka")
    read_stream(client, url)
    for i in range(25):  # 52 turns: the first falls off the newest-50 page
        send(client, conv_id, f"Message {i}")
    bubble = '<div class="plain">Remember the word quokka</div>'
    assert bubble not in client.get(f"/c/{conv_id}").text
    path, anchor = search_href(client, "quokka").split("#")
    page = client.get(path).text
    shown = len(re.findall(r'id="turn-[^"]+"', page))
    assert f'id="{anchor}"' in page and bubble in page, f"{path}: {shown} turns on the page"
