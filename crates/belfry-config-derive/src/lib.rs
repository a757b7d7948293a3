//! `#[derive(ConfigKeys)]`: the configuration reference of an option struct
//! (its keys, as serde names them, and their doc comments), so the README's
//! table is generated from the one place a key is declared.
//!
//! Field attributes, besides serde's `rename` and `skip` (read, not
//! changed):
//! - `#[config(section)]`: the field is a nested section; its type's keys
//!   are listed under the field's name.
//! - `#[config(default = "...")]`: shown as the default instead of the
//!   serialized default value.
//! - `#[config(toml_only)]`: no environment variable sets it.
//!
//! The generated code names `::belfry_core::config`.

use proc_macro::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, LitStr, parse_macro_input};

#[proc_macro_derive(ConfigKeys, attributes(config))]
pub fn derive_config_keys(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// What the attributes of one field say.
#[derive(Default)]
struct FieldAttrs {
    rename: Option<String>,
    skip: bool,
    section: bool,
    default: Option<String>,
    toml_only: bool,
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(input, "ConfigKeys needs a struct"));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(syn::Error::new_spanned(
            input,
            "ConfigKeys needs named fields",
        ));
    };
    let mut pushes = Vec::new();
    for field in &fields.named {
        let attrs = field_attrs(&field.attrs)?;
        if attrs.skip {
            continue;
        }
        let ident = field.ident.as_ref().expect("named field");
        let key = attrs
            .rename
            .unwrap_or_else(|| ident.to_string().trim_start_matches("r#").to_string());
        let cfgs = field.attrs.iter().filter(|a| a.path().is_ident("cfg"));
        let ty = &field.ty;
        let push = if attrs.section {
            quote! {
                for mut nested in <#ty as ::belfry_core::config::ConfigKeys>::config_keys() {
                    nested.key = ::std::format!("{}.{}", #key, nested.key);
                    keys.push(nested);
                }
            }
        } else {
            let doc = doc_text(&field.attrs);
            if doc.is_empty() {
                return Err(syn::Error::new_spanned(
                    field,
                    "a configuration key needs a doc comment (it is the user reference)",
                ));
            }
            let default = match attrs.default {
                Some(text) => quote!(::std::option::Option::Some(#text)),
                None => quote!(::std::option::Option::None),
            };
            let toml_only = attrs.toml_only;
            quote! {
                keys.push(::belfry_core::config::KeyDoc {
                    key: ::std::string::String::from(#key),
                    doc: #doc,
                    default: #default,
                    toml_only: #toml_only,
                });
            }
        };
        pushes.push(quote! { #(#cfgs)* { #push } });
    }
    let name = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::belfry_core::config::ConfigKeys for #name #type_generics #where_clause {
            fn config_keys() -> ::std::vec::Vec<::belfry_core::config::KeyDoc> {
                let mut keys = ::std::vec::Vec::new();
                #(#pushes)*
                keys
            }
        }
    })
}

fn field_attrs(attrs: &[syn::Attribute]) -> syn::Result<FieldAttrs> {
    let mut found = FieldAttrs::default();
    for attr in attrs {
        if attr.path().is_ident("serde") {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename") {
                    found.rename = Some(meta.value()?.parse::<LitStr>()?.value());
                } else if meta.path.is_ident("skip") {
                    found.skip = true;
                } else if meta.input.peek(syn::Token![=]) {
                    meta.value()?.parse::<syn::Lit>()?;
                } else if meta.input.peek(syn::token::Paren) {
                    let _nested;
                    syn::parenthesized!(_nested in meta.input);
                }
                Ok(())
            })?;
        } else if attr.path().is_ident("config") {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("section") {
                    found.section = true;
                } else if meta.path.is_ident("toml_only") {
                    found.toml_only = true;
                } else if meta.path.is_ident("default") {
                    found.default = Some(meta.value()?.parse::<LitStr>()?.value());
                } else {
                    return Err(
                        meta.error("expected `section`, `default = \"...\"` or `toml_only`")
                    );
                }
                Ok(())
            })?;
        }
    }
    Ok(found)
}

/// The doc comment as one line (a table cell): lines trimmed, joined by
/// spaces.
fn doc_text(attrs: &[syn::Attribute]) -> String {
    let mut words = Vec::new();
    for attr in attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(pair) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) = &pair.value
        {
            let line = text.value();
            let line = line.trim();
            if !line.is_empty() {
                words.push(line.to_string());
            }
        }
    }
    words.join(" ")
}
