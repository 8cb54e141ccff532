"""What the user does to the conversation on screen, past sending a message: edit a message (a
new version of it, a branch off its parent), regenerate or continue the last answer, go to
another version, fork into a new conversation. The store keeps the tree (kwker.app.store); these
move the window's branch in it and start the answer, through the window's start_answer."""

from __future__ import annotations

import sqlite3


class BranchActions:
    def __init__(self, window):
        self.w = window
        self.editing_index: int | None = None  # the user message being edited, if one is

    def _idle(self) -> bool:
        """Whether an action may start an answer: a model loaded, nothing running."""
        return not (self.w.generating or self.w.comparing or self.w.model_info is None)

    def add_question(self, text: str) -> None:
        """Adds the user's message at the branch's end, or as a new version of the message being
        edited (the old branch is kept: the "< 1/2 >" switcher goes back to it)."""
        w = self.w
        if self.editing_index is not None:
            w.store.set_leaf(w.cid, w.messages[self.editing_index].parent_id)
            self.editing_index = None
        if not any(m.role == "user" for m in w.messages):
            first = text.splitlines()[0]
            # at most 48 characters, cut at a word where it can be, marked as cut
            title = (
                first if len(first) <= 48 else (first[:47].rsplit(" ", 1)[0] or first[:47]) + "…"
            )
            w.store.rename(w.cid, title)
            w.title.setText(title)
        w.store.add_message(w.cid, "user", text)

    def edit_message(self, index: int):
        """Puts a user message back in the input; sending makes a new version of it, a branch of
        the conversation from there (the old one is kept)."""
        self.editing_index = index
        self.w.input.setPlainText(self.w.messages[index].content)
        self.w.input.setFocus()
        self.w.status.setText(
            "Editing a message: Send branches off there (the old branch stays a version of it)"
        )

    def continue_answer(self) -> bool:
        """Continues the last answer where max_new_tokens cut it: the model goes on from its text
        (a model on this machine: a server has no such request)."""
        w = self.w
        last = w.messages[-1] if w.messages else None
        if last is None or last.role != "assistant" or not self._idle() or w.model_info["server"]:
            return False
        w.chat.inline_error = ""
        w.start_answer(continued=last)
        return True

    def regenerate(self):
        w = self.w
        if not self._idle() or not w.messages:
            return
        last = w.messages[-1]
        if last.role == "assistant":  # a new version of it: the others are kept
            w.store.set_leaf(w.cid, last.parent_id)
        if w.store.messages(w.cid):
            w.start_answer()

    def switch_version(self, index: int, step: int) -> None:
        """Shows another version of message `index` ("< 2/3 >"), with the branch under it."""
        w = self.w
        if w.generating and w.answer.cid == w.cid:
            return  # the answer being written hangs off the branch on screen
        w.store.switch_version(w.cid, w.messages[index].id, step)
        w.open_conversation(w.cid)

    def fork_from(self, index: int) -> int | None:
        """A new conversation with this one's messages up to `index`, opened. Returns its id (None
        when the store refused it: then nothing of it was written)."""
        w = self.w
        try:
            conv = w.store.fork(w.cid, w.messages[index].id)
        except sqlite3.Error as e:
            w.show_error(f"Kwker could not fork this chat: {e}.")
            return None
        w.open_conversation(conv.id)
        w.status.setText(f"Forked into “{conv.title}”")
        return conv.id
