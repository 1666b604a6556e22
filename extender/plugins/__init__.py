"""Score and filter plugins, one module each; `extender.profile` enables and weighs them.

Every module here that defines a `Plugin` subclass with a `name` is found at start-up
(`extender.profile.builtin_plugins`): adding a plugin needs only its module and a line of
configuration. `base` holds the interface and the normalisers; README.md describes each plugin.
"""
