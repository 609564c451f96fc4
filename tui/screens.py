"""Modal screens: confirm, a line of text, settings, choosing a model, the keys, progress."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, ProgressBar, Static, TextArea
from textual.widgets.option_list import Option

from localspec.sampling import SamplingConfig

KEYS = [
    ("Enter", "send the message"),
    ("Shift+Enter, Ctrl+J", "new line in the message"),
    ("Esc", "stop the answer being written (it is kept, marked stopped)"),
    ("Ctrl+N", "new conversation"),
    ("Ctrl+B", "show or hide the conversation list"),
    ("Ctrl+T", "colour the text that came from accepted drafts, by drafter"),
    ("Ctrl+P", "command palette: every command, by name"),
    ("F1", "this list"),
    ("F2", "rename the conversation"),
    ("F3", "statistics of every answer"),
    ("F4", "copy the last code block"),
    ("F5", "write the last answer again"),
    ("F6", "settings: system prompt, temperature, seed, drafter"),
    ("F7", "switch model"),
    ("F8", "delete the conversation"),
    ("F9", "export the conversation as Markdown"),
    ("Ctrl+Q", "quit"),
]


class Modal(ModalScreen):
    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]


class KeysScreen(Modal):
    BINDINGS = [Binding("escape,f1,q", "dismiss(None)", "Close")]

    def compose(self) -> ComposeResult:
        width = max(len(k) for k, _ in KEYS) + 3
        with Vertical(classes="dialog wide"):
            yield Label("Keys", classes="title")
            yield Static("\n".join(f"{k:<{width}}{what}" for k, what in KEYS), markup=False)


class ConfirmScreen(Modal):
    AUTO_FOCUS = "#no"  # Enter on its own keeps what is there

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="title")
            with Horizontal(classes="buttons"):
                yield Button("Delete", id="yes", variant="error")
                yield Button("Keep", id="no")

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class TextScreen(Modal):
    """One line of text (a title)."""

    AUTO_FOCUS = "#value"

    def __init__(self, title: str, value: str):
        super().__init__()
        self.title_text, self.value = title, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="title")
            yield Input(self.value, id="value")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)


@dataclass
class Settings:
    system_prompt: str
    temperature: float
    seed: int | None
    drafter: str


class SettingsScreen(Modal):
    """The conversation's system prompt, temperature, seed and drafter; checked before they
    are taken."""

    AUTO_FOCUS = "#system"

    def __init__(self, current: Settings, check_drafter):
        super().__init__()
        self.current, self.check_drafter = current, check_drafter

    def compose(self) -> ComposeResult:
        c = self.current
        with Vertical(classes="dialog wide"):
            yield Label("Settings of this conversation", classes="title")
            yield Label("System prompt")
            yield TextArea(c.system_prompt, id="system", soft_wrap=True, show_line_numbers=False)
            with Horizontal(classes="fields"):
                with Vertical():
                    yield Label("Temperature (0: greedy)")
                    yield Input(f"{c.temperature:g}", id="temperature")
                with Vertical():
                    yield Label("Seed (empty: random)")
                    yield Input("" if c.seed is None else str(c.seed), id="seed")
                with Vertical():
                    yield Label("Drafter")
                    yield Input(c.drafter, id="drafter")
            yield Label("", id="problem", classes="problem")
            with Horizontal(classes="buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#save")
    @on(Input.Submitted)
    def save(self) -> None:
        try:
            temperature = float(self.query_one("#temperature", Input).value)
            if not 0 <= temperature <= 5:
                raise ValueError("temperature must be between 0 and 5")
            seed_text = self.query_one("#seed", Input).value.strip()
            seed = int(seed_text) if seed_text else None
            SamplingConfig(temperature=temperature, seed=seed)  # what the answers will be asked with
            drafter = self.query_one("#drafter", Input).value.strip() or "auto"
            self.check_drafter(drafter)
        except Exception as e:  # noqa: BLE001 -- shown to the user, who fixes it
            self.query_one("#problem", Label).update(str(e).splitlines()[0])
            return
        self.dismiss(Settings(self.query_one("#system", TextArea).text, temperature, seed, drafter))


class ModelScreen(Modal):
    """The models the store knows; one not on disk is pulled first."""

    AUTO_FOCUS = "OptionList"

    def __init__(self, rows: list[tuple[str, int, int | None, str]], current: str):
        super().__init__()
        self.rows, self.current = rows, current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Switch model", classes="title")
            yield OptionList(*[Option(f"{'●' if name == self.current else ' '} {name}  "
                                      f"({size / 1e6:.0f} MB{'' if on_disk else ', to download'})  {desc}",
                                      id=name) for name, size, on_disk, desc in self.rows])

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)


class ProgressScreen(ModalScreen):
    """Long work (loading a model, measuring its cost curve, downloading) shown as it goes."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("", id="what", classes="title")
            yield ProgressBar(total=None, show_eta=False, id="bar")

    def on_key(self, event: events.Key) -> None:
        """What is typed meanwhile goes to the message box below, to be sent once the model
        is ready (Enter, which would send it, waits for that)."""
        prompt = self.app.screen_stack[0].query_one("#prompt", TextArea)
        if event.key == "ctrl+j":
            prompt.insert("\n")
        elif event.key == "backspace":
            prompt.action_delete_left()
        elif event.is_printable:
            prompt.insert(event.character)
        else:
            return
        event.stop()

    def report(self, what: str, done: float, total: float) -> None:
        if not self.is_mounted:
            return
        self.query_one("#what", Label).update(what)
        self.query_one("#bar", ProgressBar).update(total=total, progress=done)
