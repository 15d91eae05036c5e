// Gives the shared precompiled-header target one translation unit.
