"""The queue's operations: model + storage, never HTTP."""
