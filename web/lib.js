// The view library: Preact with hooks, and htm for templates (tagged template literals: no build
// step). Everything interpolated into a template is text unless it is itself a template: user strings
// can never become HTML.

import { useCallback, useEffect, useMemo, useReducer, useRef, useState } from "/ui/vendor/hooks.js";
import htm from "/ui/vendor/htm.js";
import { Fragment, h, render } from "/ui/vendor/preact.js";

export const html = htm.bind(h);
export { Fragment, render, useCallback, useEffect, useMemo, useReducer, useRef, useState };
