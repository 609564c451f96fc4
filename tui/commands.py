"""The chat's commands beyond asking: its keys and the command palette's entries (rename,
delete, export, copy a code block, per-conversation settings, another model, what is shown).
A part of ChatApp (tui/app.py), which holds the store, the conversation and the engine."""

from __future__ import annotations

import re
from pathlib import Path

from textual import work
from textual.app import SystemCommand
from textual.screen import Screen

from localspec import store as model_store
from localspec.drafters.spec import DrafterSpec
from tui.screens import ConfirmScreen, KeysScreen, ModelScreen, ProgressScreen, Settings, SettingsScreen, TextScreen
from tui.store import Conversation, Message
from tui.widgets import MessageView


class ChatCommands:
    def action_toggle_list(self) -> None:
        options = self.query_one("#conversations")
        options.display = not options.display
        self.saving(lambda: self.store.set_setting("list", "shown" if options.display else "hidden"))

    async def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        for view in self.query(MessageView):
            await view.set_highlight(self.highlight)
        self.notify("Drafted text coloured by drafter: lookup green, draft model yellow, Jakiro "
                    "accent" if self.highlight else "Drafted text shown plain")

    def action_toggle_stats(self) -> None:
        self.query_one("#messages").toggle_class("show-stats")

    def action_keys(self) -> None:
        self.push_screen(KeysScreen())

    def action_rename(self) -> None:
        if self.conversation is None:
            return

        def done(title: str | None) -> None:
            if title:
                self.conversation.title = title
                self.saving(lambda: self.store.update_conversation(self.conversation))
                self.sub_title = title
                self.refresh_list()
        self.push_screen(TextScreen("Rename the conversation", self.conversation.title), done)

    def action_delete(self) -> None:
        if self.conversation is None or self.answer is not None:
            return

        async def done(yes: bool | None) -> None:
            if yes:
                if not self.saving(lambda: self.store.delete_conversation(self.conversation.id)):
                    return
                await self.action_new_conversation()
                self.refresh_list()
                self.notify("Conversation deleted.")
        self.push_screen(ConfirmScreen(f"Delete “{self.conversation.title}”?"), done)

    def action_export(self) -> None:
        if self.conversation is None:
            return
        c = self.conversation
        slug = re.sub(r"[^a-z0-9]+", "-", (c.title or "conversation").lower()).strip("-")[:40] or "conversation"
        path = Path.cwd() / f"{slug}.md"
        n = 1
        while path.exists():
            n += 1
            path = Path.cwd() / f"{slug}-{n}.md"
        try:
            path.write_text(export_markdown(c, self.store.messages(c.id)))
        except OSError as e:
            self.notify(f"Not exported: {e.strerror or e} ({path})", severity="error", markup=False)
            return
        self.notify(f"Exported to {path}", markup=False)

    def action_copy_code(self) -> None:
        views = [v for v in self.query(MessageView) if v.role == "assistant"]
        blocks = re.findall(r"```[^\n]*\n(.*?)```", views[-1].text, re.S) if views else []
        if not blocks:
            self.notify("No code block in the last answer.", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify(f"Copied the last code block ({len(blocks[-1].splitlines())} lines).")

    def action_settings(self) -> None:
        c = self.saving(self.current_conversation)
        if c is None:
            return

        def done(s: Settings | None) -> None:
            if s is not None:
                c.system_prompt, c.drafter = s.system_prompt, s.drafter
                c.sampling = {"temperature": s.temperature, "seed": s.seed}
                if self.saving(lambda: self.store.update_conversation(c)):
                    self.notify("Settings saved for this conversation.")
                self._prepare(s.drafter)
        current = Settings(c.system_prompt, c.sampling.get("temperature", 0.0), c.sampling.get("seed"), c.drafter)
        self.push_screen(SettingsScreen(current, DrafterSpec.parse), done)

    @work(exclusive=True, group="prepare")
    async def _prepare(self, drafter: str) -> None:
        """Build the drafter the conversation now names before its next message (which waits
        behind this in the engine's queue), and say in one line if it cannot be had."""
        job = self.worker.submit(lambda engine, cancel: engine.prepare(DrafterSpec.parse(drafter)) or [])
        item = await job.out.get()
        if isinstance(item, Exception):
            self.notify(f"drafter {drafter}: {item}", severity="error")

    def action_switch_model(self) -> None:
        if self.answer is not None:
            return

        def done(name: str | None) -> None:
            if name:
                self.switch_model(name)
        self.push_screen(ModelScreen(model_store.listing(), Path(self.model_name).stem), done)

    def switch_model(self, name: str) -> None:
        """Load `name` (pulled first if it must be) in place of the model there is; if it
        cannot be loaded, the model there was is loaded again."""
        self.loading = True
        self._progress = ProgressScreen()
        self.push_screen(self._progress)
        self._fallback = self.model_name if self.engine is not None else None
        self._load(name, pull=True)

    def get_system_commands(self, screen: Screen):
        yield from super().get_system_commands(screen)
        for title, help_text, action in [
            ("New conversation", "Start an empty conversation (Ctrl+N)", self.action_new_conversation),
            ("Rename conversation", "Give this conversation another title (F2)", self.action_rename),
            ("Delete conversation", "Delete this conversation, after asking (F8)", self.action_delete),
            ("Export as Markdown", "Write this conversation to a .md file here (F9)", self.action_export),
            ("Settings", "System prompt, temperature, seed and drafter (F6)", self.action_settings),
            ("Switch model", "Load another model, downloading it if needed (F7)", self.action_switch_model),
            ("Regenerate", "Write the last answer again (F5)", self.action_regenerate),
            ("Copy code block", "Copy the last answer's last code block (F4)", self.action_copy_code),
            ("Colour drafted text", "Show which text came from accepted drafts (Ctrl+T)",
             self.action_toggle_highlight),
            ("Answer statistics", "Show each answer's numbers (F3)", self.action_toggle_stats),
            ("Conversation list", "Show or hide it (Ctrl+B)", self.action_toggle_list),
        ]:
            yield SystemCommand(title, help_text, action)


def export_markdown(c: Conversation, messages: list[Message]) -> str:
    lines = [f"# {c.title or 'Conversation'}", "", f"*{c.model}*", ""]
    if c.system_prompt:
        lines += ["**System:**", "", c.system_prompt, ""]
    for m in messages:
        lines += [f"**{'You' if m.role == 'user' else 'Assistant'}:**", "", m.text, ""]
        if m.stopped:
            lines += ["*(stopped)*", ""]
    return "\n".join(lines)
